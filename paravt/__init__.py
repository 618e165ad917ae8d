"""ParaVT: parallel video tool calling with PARA-GRPO (a reproduction of arXiv 2605.20342)."""

__version__ = "0.1.0"
