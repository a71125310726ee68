"""The scripted builder's pages: one status dashboard for a fictional coffee roastery, in
four variants (the original, a Scandinavian restyle, a green CRT terminal, and the
original plus a seven-day chart in inline SVG).

Every variant is ONE self-contained HTML file: inline CSS, system fonts, no external
resources. All data is static so that two captures of the same page differ only in the
pulsing status dot, whose animation phase is set from the wall clock at load time.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CHART_DAYS",
    "CHART_SCALE_PX_PER_KG",
    "DOT_PERIOD_MS",
    "ROASTERY",
    "VARIANTS",
    "page",
]

ROASTERY: Final = "Ember & Oak Coffee Roasters"
DOT_PERIOD_MS: Final = 1600
CHART_SCALE_PX_PER_KG: Final = 0.8
#: Kilograms roasted on each of the last seven days (the chart's labels).
CHART_DAYS: Final[tuple[tuple[str, int], ...]] = (
    ("Mon", 168),
    ("Tue", 192),
    ("Wed", 144),
    ("Thu", 210),
    ("Fri", 186),
    ("Sat", 96),
    ("Sun", 72),
)

_METRICS: Final = (
    ("Roasted this week", "1,284 kg", "+8.2 % on last week"),
    ("Batches today", "14", "3 queued on Roaster 2"),
    ("Green coffee stock", "4.6 t", "about 5 weeks of supply"),
    ("Orders to ship", "37", "12 wholesale, 25 web shop"),
)

_BATCHES: Final = (
    ("R-2417", "Ethiopia Guji, washed", "Light, filter", "24.0 kg", "Agtron 78", "Cooling"),
    ("R-2416", "Colombia Huila", "Medium", "30.0 kg", "Agtron 63", "Packed"),
    ("R-2415", "Brazil Cerrado, natural", "Espresso", "30.0 kg", "Agtron 55", "Packed"),
    ("R-2414", "Kenya Nyeri AA", "Light, filter", "18.0 kg", "Agtron 80", "Cupping"),
    ("R-2413", "Guatemala Huehuetenango", "Medium", "24.0 kg", "Agtron 65", "Packed"),
    ("R-2412", "Sumatra Mandheling", "Dark", "30.0 kg", "Agtron 45", "QC hold"),
)

_BASE_CSS: Final = """
*{box-sizing:border-box}
html,body{margin:0}
.wrap{max-width:1200px;margin:0 auto;padding:0 32px 32px}
.hd{display:flex;align-items:center;justify-content:space-between}
header h1{margin:0}
.live{display:flex;align-items:center;gap:10px}
.dot{width:10px;height:10px;border-radius:50%;display:inline-block;
  animation:pulse PERIODms ease-in-out infinite}
@keyframes pulse{0%,100%{opacity:1;transform:scale(1)}50%{opacity:.2;transform:scale(.6)}}
.cards{display:grid;grid-template-columns:repeat(4,1fr);gap:20px;margin:24px 0}
.card .label{font-size:13px}
.card .value{font-size:32px;margin:8px 0 4px}
.card .note{font-size:13px}
.row{display:flex;gap:20px;align-items:flex-start}
.row>section{flex:1}
table{width:100%;border-collapse:collapse;font-size:14px}
th,td{text-align:left;padding:10px 12px}
h2{font-size:16px;margin:0 0 12px}
.chart svg{display:block}
.row>section.chart{flex:0 0 auto}
"""

_THEMES: Final[dict[str, str]] = {
    # Warm roastery colours: espresso header, cream page, copper accent.
    "original": """
body{font-family:"DejaVu Sans",system-ui,sans-serif;background:#f5efe6;color:#2b1d14}
header{background:#2b1d14;color:#f5efe6}
.hd{padding:22px 32px}
header h1{font-size:24px;letter-spacing:.5px}
header .sub{color:#d9b99b;font-size:13px;margin-top:4px}
.live{font-size:14px;color:#f5efe6}
.dot{background:#4cc46a}
.card{background:#fff;border-radius:10px;padding:18px 20px;
  box-shadow:0 1px 3px rgba(43,29,20,.15);border-top:4px solid #c8662b}
.card .label{color:#8a6a52;text-transform:uppercase;letter-spacing:.6px}
.card .value{font-weight:bold;color:#2b1d14}
.card .note{color:#6b8f4e}
section{background:#fff;border-radius:10px;padding:18px 20px;
  box-shadow:0 1px 3px rgba(43,29,20,.15)}
h2{color:#2b1d14}
th{background:#efe3d3;color:#5a3e2b;font-size:12px;text-transform:uppercase}
td{border-bottom:1px solid #efe3d3}
.status{font-weight:bold;color:#c8662b}
.bar{fill:#c8662b}.axis{stroke:#d8c7b4}.lbl{fill:#5a3e2b;font-size:12px}
.val{fill:#2b1d14;font-size:12px;font-weight:bold}
""",
    # Minimal Scandinavian: white space, hairlines, thin type, one muted sage accent.
    "scandinavian": """
body{font-family:"DejaVu Sans","Liberation Sans",sans-serif;background:#fbfaf7;color:#222}
.hd{padding:40px 0 28px;max-width:1136px;border-bottom:1px solid #e4e1da}
header h1{font-size:28px;font-weight:normal;letter-spacing:-.5px}
header .sub{color:#8d8a83;font-size:13px;margin-top:6px;letter-spacing:2px;
  text-transform:uppercase}
.live{font-size:13px;color:#8d8a83;letter-spacing:1px;text-transform:uppercase}
.dot{background:#8aa899}
.cards{gap:0;margin:36px 0;border-top:1px solid #e4e1da;border-bottom:1px solid #e4e1da}
.card{padding:24px 24px 24px 0}
.card+.card{border-left:1px solid #e4e1da;padding-left:24px}
.card .label{color:#8d8a83;letter-spacing:1.5px;text-transform:uppercase;font-size:11px}
.card .value{font-weight:normal;font-size:38px;color:#1f1f1f}
.card .note{color:#8aa899}
h2{font-weight:normal;font-size:13px;letter-spacing:2px;text-transform:uppercase;
  color:#8d8a83}
th{color:#8d8a83;font-weight:normal;font-size:11px;letter-spacing:1.5px;
  text-transform:uppercase;border-bottom:1px solid #222}
td{border-bottom:1px solid #ecebe6;color:#333}
.status{color:#5f7f6f}
""",
    # Retro green phosphor terminal: black glass, monospace glow, static scanlines.
    "crt": """
body{font-family:"DejaVu Sans Mono","Liberation Mono",monospace;background:#030a04;
  color:#39ff6a;text-shadow:0 0 4px rgba(57,255,106,.55)}
body::after{content:"";position:fixed;inset:0;pointer-events:none;
  background:repeating-linear-gradient(0deg,rgba(0,0,0,.28) 0 1px,transparent 1px 3px)}
header{padding:24px 32px 0}
.hd{border:2px solid #39ff6a;padding:14px 18px;max-width:1136px}
header h1{font-size:22px;text-transform:uppercase;letter-spacing:2px}
header h1::before{content:"> "}
header .sub{color:#1fae45;font-size:13px;margin-top:4px}
header .sub::after{content:" _"}
.live{font-size:14px;text-transform:uppercase}
.dot{background:#39ff6a;border-radius:0;box-shadow:0 0 4px #39ff6a}
.card{border:1px dashed #39ff6a;padding:14px 16px}
.card .label{text-transform:uppercase;color:#1fae45}
.card .label::before{content:"[ "}.card .label::after{content:" ]"}
.card .value{font-size:30px}
.card .note{color:#1fae45}
section{border:1px solid #39ff6a;padding:14px 16px}
h2{text-transform:uppercase;letter-spacing:2px}
h2::before{content:"## "}
th{color:#030a04;background:#39ff6a;text-shadow:none;text-transform:uppercase;font-size:12px}
td{border-bottom:1px dashed #145c28}
.status{color:#b6ffc9}
""",
}

_DOT_SCRIPT: Final = (
    "<script>/* phase the pulse by the wall clock: no two loads look alike */"
    "document.querySelectorAll('.dot').forEach(function(d){"
    f"d.style.animationDelay=-(Date.now()%{DOT_PERIOD_MS})+'ms';}});</script>"
)


def _cards() -> str:
    return "".join(
        f'<div class="card"><div class="label">{label}</div>'
        f'<div class="value">{value}</div><div class="note">{note}</div></div>'
        for label, value, note in _METRICS
    )


def _table() -> str:
    head = "".join(
        f"<th>{h}</th>" for h in ("Batch", "Origin", "Profile", "Weight", "Roast", "Status")
    )
    rows = "".join(
        "<tr>" + "".join(f"<td>{c}</td>" for c in cells[:-1])
        + f'<td class="status">{cells[-1]}</td></tr>'
        for cells in _BATCHES
    )  # fmt: skip
    return (
        "<section><h2>Recent roast batches</h2>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _chart() -> str:
    """Seven bars whose heights are exactly ``value * CHART_SCALE_PX_PER_KG`` px."""
    width, height, base, step, bar_w = 380, 260, 220, 50, 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="kg roasted per day">',
        f'<line class="axis" x1="10" y1="{base}" x2="{width - 10}" y2="{base}" '
        'stroke="#d8c7b4" stroke-width="1"/>',
    ]
    for i, (day, kg) in enumerate(CHART_DAYS):
        x = 25 + i * step
        h = round(kg * CHART_SCALE_PX_PER_KG, 1)
        cx = x + bar_w / 2
        parts.append(
            f'<rect class="bar" x="{x}" y="{round(base - h, 1)}" width="{bar_w}" '
            f'height="{h}" rx="2" fill="#c8662b"/>'
            f'<text class="val" x="{cx}" y="{round(base - h - 6, 1)}" '
            f'text-anchor="middle">{kg}</text>'
            f'<text class="lbl" x="{cx}" y="{base + 18}" text-anchor="middle">{day}</text>'
        )
    parts.append("</svg>")
    return (
        '<section class="chart"><h2>Roasted per day, last 7 days (kg)</h2>'
        + "".join(parts)
        + "</section>"
    )


def page(variant: str) -> str:
    """The full HTML of ``variant`` (one of :data:`VARIANTS`). :raises KeyError:"""
    theme = "original" if variant == "chart" else variant
    css = _BASE_CSS.replace("PERIOD", str(DOT_PERIOD_MS)) + _THEMES[theme]
    body = _table() if variant != "chart" else _table() + _chart()
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        # An empty inline icon: no /favicon.ico request (and 404) to the guest's server.
        '<link rel="icon" href="data:,">'
        f"<title>{ROASTERY} · Roastery status</title><style>{css}</style></head><body>"
        '<header><div class="wrap hd"><div>'
        f'<h1>{ROASTERY}</h1><div class="sub">Roastery status · Warehouse 3, Leith</div>'
        '</div><div class="live"><span class="dot"></span>Roaster 1 online</div></div></header>'
        f'<div class="wrap"><div class="cards">{_cards()}</div>'
        f'<div class="row">{body}</div></div>'
        f"{_DOT_SCRIPT}</body></html>\n"
    )


VARIANTS: Final = ("original", "scandinavian", "crt", "chart")
