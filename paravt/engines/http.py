"""One aiohttp session per client, shared by the HTTP engines (SGLang native, OpenAI chat)."""

from __future__ import annotations


class HTTPSessionMixin:
    """Lazily opened session, a health probe and close. Subclasses set ``request_timeout_s``,
    ``health_url`` and optionally ``headers``."""

    _session = None
    headers: dict[str, str] = {}
    request_timeout_s: float = 600.0

    @property
    def health_url(self) -> str:  # pragma: no cover - overridden
        raise AttributeError("health_url")

    async def _http(self):
        import aiohttp  # noqa: PLC0415

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self.headers,
                                                  timeout=aiohttp.ClientTimeout(total=self.request_timeout_s))
        return self._session

    async def health(self) -> bool:
        try:
            session = await self._http()
            async with session.get(self.health_url) as r:
                return r.status == 200
        except Exception:  # noqa: BLE001 - unhealthy is an answer, not an error
            return False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
