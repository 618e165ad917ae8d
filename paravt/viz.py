"""A static trajectory viewer for video tool use: one self-contained HTML page per run.

    python -m paravt.viz runs/quickstart/rl_paragrpo/trajectories.jsonl -o rl.html
    python -m paravt.viz runs/eval/paravt-8b/image_url/synthetic.jsonl -o eval.html   # save_trajectory=true

Per episode: the overview frames as a thumbnail strip with their timestamps (when the run kept
thumbnails: RL ``logging.trajectory_thumbnails``, eval ``trajectory_thumbnails``), a timeline of
the video with each turn's parallel crop windows drawn against the true answer span, each
sub-agent's summary, the main agent's turns (thoughts, calls, answer), the reward terms and the
score. Filters: K, correct / incorrect, question type. No server, no external files: the data
is embedded as JSON and rendered by a few lines of inline JavaScript (text is inserted with
``textContent``, never as HTML).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterable


def episode_from_record(rec: dict[str, Any]) -> dict[str, Any] | None:
    """One viewer episode from an RL ``trajectories.jsonl`` line or an eval result line (with
    ``trajectory``); None for an eval line saved without its trajectory."""
    traj = rec.get("trajectory", rec) if "trajectory" in rec else rec
    if "turns" not in traj:
        return None
    reward = rec.get("reward") or traj.get("reward")
    score = rec.get("score", traj.get("score"))
    if score is None and reward:
        score = reward.get("acc")
    turns = []
    for t in traj.get("turns", []):
        turns.append({"text": t.get("text", ""), "finish": t.get("finish_reason", ""),
                      "parse_errors": t.get("parse_errors", []), "dropped": t.get("dropped_calls", 0),
                      "calls": [{"window": c.get("window"), "ok": bool(c.get("ok")), "error": c.get("error"),
                                 "response": c.get("response", ""), "arguments": c.get("arguments", {})}
                                for c in t.get("calls", [])]})
    return {
        "id": str(rec.get("id") or traj.get("sample_id", "")), "k": traj.get("k"),
        "qtype": rec.get("question_type") or traj.get("question_type") or "",
        "question": traj.get("question") or rec.get("question") or "",
        "answer": rec.get("answer", traj.get("answer")), "span": traj.get("span") or rec.get("span"),
        "score": score, "correct": bool(score) and float(score) > 0, "reward": reward,
        "duration": traj.get("duration"), "step": rec.get("step"), "end_reason": traj.get("end_reason", ""),
        "error": traj.get("error") or rec.get("error"), "overview": traj.get("overview") or [], "turns": turns,
    }


def load_episodes(paths: Iterable[str | Path]) -> tuple[list[dict[str, Any]], int]:
    """(episodes, lines skipped): bad JSON and results without a trajectory are counted, not fatal."""
    eps, skipped = [], 0
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            try:
                ep = episode_from_record(json.loads(line))
            except (json.JSONDecodeError, AttributeError, TypeError):
                ep = None
            if ep is None:
                skipped += 1
            else:
                eps.append(ep)
    return eps, skipped


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f4f5f7;color:#222}
header{position:sticky;top:0;background:#1f2937;color:#fff;padding:10px 16px;display:flex;gap:16px;align-items:center;z-index:1}
header h1{font-size:16px;margin:0 12px 0 0} header select{margin-left:4px}
main{padding:12px 16px} .ep{background:#fff;border-radius:8px;padding:12px 14px;margin:0 0 14px;box-shadow:0 1px 3px #0002}
.meta{display:flex;flex-wrap:wrap;gap:8px;margin-bottom:6px} .tag{background:#e5e7eb;border-radius:4px;padding:1px 6px;font-size:12px}
.ok{background:#d1fae5} .bad{background:#fee2e2} .q{margin:4px 0 8px;white-space:pre-wrap}
.strip{display:flex;gap:3px;overflow-x:auto;padding-bottom:4px} .strip figure{margin:0;text-align:center;font-size:10px;color:#555}
.strip img{display:block;height:48px;border-radius:2px} svg{display:block;margin:6px 0}
.turn{border-left:3px solid #6366f1;padding:2px 8px;margin:6px 0} .turn pre{white-space:pre-wrap;margin:2px 0;font:12px/1.35 ui-monospace,monospace}
.call{margin:2px 0 2px 12px;font-size:12px} .call b{font-weight:600} .err{color:#b91c1c}
#count{font-size:12px;opacity:.8}
"""

_JS = """
const EPS = JSON.parse(document.getElementById('data').textContent);
const COLORS = ['#6366f1','#f59e0b','#10b981','#ef4444','#8b5cf6'];
function el(tag, attrs, text){const e=document.createElement(tag); for(const k in (attrs||{})) e.setAttribute(k, attrs[k]);
  if(text!==undefined && text!==null) e.textContent=String(text); return e;}
function svgEl(tag, attrs){const e=document.createElementNS('http://www.w3.org/2000/svg', tag); for(const k in attrs) e.setAttribute(k, attrs[k]); return e;}
function fill(sel, values){const s=document.getElementById(sel); [...new Set(values)].filter(v=>v!==null&&v!==undefined&&v!=='')
  .sort((a,b)=>a-b||String(a).localeCompare(String(b))).forEach(v=>s.appendChild(el('option',{value:String(v)},v)));}
function timeline(ep){
  const W=720, rows=ep.turns.filter(t=>t.calls.length).length, H=26+14*rows;
  const dur=ep.duration || Math.max(1,...ep.turns.flatMap(t=>t.calls.map(c=>c.window?c.window[1]:0)), ...(ep.span||[0]));
  const x=t=>10+(W-20)*Math.max(0,Math.min(1,t/dur));
  const svg=svgEl('svg',{width:W,height:H,'class':'timeline'});
  svg.appendChild(svgEl('rect',{x:10,y:8,width:W-20,height:6,fill:'#d1d5db'}));
  (ep.overview||[]).forEach(f=>svg.appendChild(svgEl('rect',{x:x(f.t)-0.5,y:5,width:1,height:12,fill:'#6b7280'})));
  if(ep.span && ep.span.length===2){const g=svgEl('rect',{x:x(ep.span[0]),y:3,width:Math.max(2,x(ep.span[1])-x(ep.span[0])),height:H-6,fill:'#10b98133',stroke:'#059669'});
    g.appendChild(svgEl('title',{})).textContent='answer span '+ep.span.join(' - ')+' s'; svg.appendChild(g);}
  let r=0; ep.turns.forEach((t,ti)=>{ if(!t.calls.length) return; const y=22+14*r; r++;
    t.calls.forEach((c,ci)=>{ if(!c.window) return; const b=svgEl('rect',{x:x(c.window[0]),y:y,width:Math.max(2,x(c.window[1])-x(c.window[0])),height:10,
      fill:c.ok?COLORS[ci%COLORS.length]:'#9ca3af',opacity:0.8,'class':'crop'});
      b.appendChild(svgEl('title',{})).textContent='turn '+(ti+1)+' call '+(ci+1)+': '+c.window.map(v=>v.toFixed(1)).join(' - ')+' s'; svg.appendChild(b);});});
  const lab=svgEl('text',{x:W-12,y:H-2,'text-anchor':'end','font-size':10,fill:'#555'}); lab.textContent=dur.toFixed(0)+' s'; svg.appendChild(lab);
  return svg;}
function card(ep){
  const d=el('section',{'class':'ep'}); const m=el('div',{'class':'meta'});
  m.appendChild(el('span',{'class':'tag'},ep.id)); m.appendChild(el('span',{'class':'tag'},'K = '+ep.k));
  if(ep.qtype) m.appendChild(el('span',{'class':'tag'},ep.qtype));
  if(ep.step!==null && ep.step!==undefined) m.appendChild(el('span',{'class':'tag'},'step '+ep.step));
  m.appendChild(el('span',{'class':'tag '+(ep.correct?'ok':'bad')},'score '+(ep.score===null||ep.score===undefined?'-':Number(ep.score).toFixed(2))));
  if(ep.reward) m.appendChild(el('span',{'class':'tag'},'reward '+['total','acc','format','tool'].map(k=>k+' '+Number(ep.reward[k]).toFixed(2)).join(' · ')));
  m.appendChild(el('span',{'class':'tag'},'end: '+ep.end_reason));
  d.appendChild(m);
  d.appendChild(el('div',{'class':'q'},ep.question)); d.appendChild(el('div',{'class':'q'},'gold answer: '+JSON.stringify(ep.answer)));
  if(ep.error) d.appendChild(el('div',{'class':'err'},'error: '+ep.error));
  if(ep.overview.length){const s=el('div',{'class':'strip'}); ep.overview.forEach(f=>{const fig=el('figure'); fig.appendChild(el('img',{src:f.jpeg,alt:'frame at '+f.t+' s'}));
    fig.appendChild(el('figcaption',{},f.t.toFixed(1)+' s')); s.appendChild(fig);}); d.appendChild(s);}
  d.appendChild(timeline(ep));
  ep.turns.forEach((t,i)=>{const tu=el('div',{'class':'turn'}); tu.appendChild(el('b',{},'turn '+(i+1)+(t.finish?' ('+t.finish+')':'')));
    tu.appendChild(el('pre',{},t.text));
    t.calls.forEach((c,ci)=>{const cd=el('div',{'class':'call'}); cd.appendChild(el('b',{},'crop '+(ci+1)+' '+(c.window?c.window.map(v=>v.toFixed(1)).join(' - ')+' s':'(no window)')+': '));
      cd.appendChild(el('span',{'class':c.ok?'':'err'}, c.ok?c.response:(c.error||c.response))); tu.appendChild(cd);});
    t.parse_errors.forEach(e=>tu.appendChild(el('div',{'class':'call err'},'parse error: '+e)));
    if(t.dropped) tu.appendChild(el('div',{'class':'call err'},t.dropped+' call(s) dropped over the per-turn cap'));
    d.appendChild(tu);});
  return d;}
function render(){const k=document.getElementById('fk').value, c=document.getElementById('fc').value, q=document.getElementById('fq').value;
  const main=document.getElementById('eps'); main.replaceChildren();
  const shown=EPS.filter(e=>(k===''||String(e.k)===k)&&(c===''||(c==='1')===e.correct)&&(q===''||e.qtype===q));
  shown.forEach(e=>main.appendChild(card(e)));
  document.getElementById('count').textContent=shown.length+' of '+EPS.length+' episodes';}
fill('fk', EPS.map(e=>e.k)); fill('fq', EPS.map(e=>e.qtype));
['fk','fc','fq'].forEach(id=>document.getElementById(id).addEventListener('change', render)); render();
"""


def render_html(episodes: list[dict[str, Any]], title: str = "ParaVT trajectories") -> str:
    data = json.dumps(episodes, ensure_ascii=False, default=str).replace("</", "<\\/")
    esc = title.replace("&", "&amp;").replace("<", "&lt;")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc}</title><style>{_CSS}</style></head>
<body><header><h1>{esc}</h1>
<label>K<select id="fk"><option value="">all</option></select></label>
<label>result<select id="fc"><option value="">all</option><option value="1">correct</option><option value="0">incorrect</option></select></label>
<label>question type<select id="fq"><option value="">all</option></select></label>
<span id="count"></span></header>
<main id="eps"></main>
<script type="application/json" id="data">{data}</script>
<script>{_JS}</script></body></html>
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m paravt.viz", description=__doc__.split("\n\n")[0])
    ap.add_argument("jsonl", nargs="+", help="RL trajectories.jsonl or eval <split>.jsonl (save_trajectory=true)")
    ap.add_argument("-o", "--out", required=True, help="the HTML page to write")
    ap.add_argument("--title", default=None)
    ap.add_argument("--limit", type=int, default=None, help="at most this many episodes (the first ones)")
    a = ap.parse_args(argv)
    missing = [p for p in a.jsonl if not Path(p).is_file()]
    if missing:
        print(f"python -m paravt.viz: not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    eps, skipped = load_episodes(a.jsonl)
    if a.limit:
        eps = eps[: a.limit]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(render_html(eps, a.title or ", ".join(Path(p).name for p in a.jsonl)), encoding="utf-8")
    print(f"{a.out}: {len(eps)} episodes" + (f" ({skipped} lines without a trajectory skipped)" if skipped else ""))
    return 0 if eps else 1


if __name__ == "__main__":
    sys.exit(main())
