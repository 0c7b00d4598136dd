"""Draw the realistic workloads' figures (the ``--json`` of ``bench/realistic.py``) as one PNG.

    python bench/realistic.py --tree dff285b=../old --json realistic.json
    python bench/charts.py realistic.json docs/realistic.png

Four panels, one bar (or a pair of bars, p50 and p99) per bot, each the median over the rounds: the busy group's
reply delay, the backlog's drain rate, the slow upstream's reply delay, and the peak RSS with handlers in flight.
Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

#: how a bot label of ``bench/realistic.py`` reads on the chart
_NAMES = {"plain": "plain\ntelebot", "sqlite": "fence\nSQLite", "postgres": "fence\nPostgreSQL"}
_COLOURS = {"plain": "#7f7f7f", "sqlite": "#1f77b4", "postgres": "#2ca02c"}


def label(bot: str, this: str = "") -> str:
    """``sqlite@abc123`` → ``fence SQLite (abc123)`` on two lines; ``this`` names the checkout of unmarked fences."""
    kind, _, tree = bot.partition("@")
    tree = tree or (this if kind != "plain" else "")
    return _NAMES.get(kind, kind) + (f"\n({tree})" if tree else "")


def medians(runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """The median of every figure per (workload, bot), over the runs that finished."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        if run.get("ok"):
            grouped.setdefault((run["workload"], run["bot"]), []).append(run)
    out = {}
    for key, group in grouped.items():
        names = {k for run in group for k, v in run.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        out[key] = {k: statistics.median(run[k] for run in group if k in run) for k in names}
    return out


def draw(data: dict[str, Any], target: Path, this: str = "") -> None:
    """Write the four-panel chart of ``data`` (a realistic.py ``--json``) to ``target``; ``this`` labels the fences
    of the checkout realistic.py ran from (when ``--tree`` added others)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    figures = medians(data["runs"])
    bots: list[str] = []
    for run in data["runs"]:
        if run["bot"] not in bots:
            bots.append(run["bot"])
    bots.sort(key=lambda b: (list(_NAMES).index(b.partition("@")[0]) if b.partition("@")[0] in _NAMES else 9,
                             b.partition("@")[2] == "", b))
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    shape = {"busy": {"rate": 100}, "backlog": {"backlog": 3000}, "slow": {"handler_wait": 2.0, "rate": 8},
             "inflight": {"backlog": 40}}
    shape.update(data.get("workloads", {}))
    panels = [
        ("busy", ("p50_ms", "p99_ms"), 1.0,
         f"busy group, {shape['busy']['rate']:g} updates/s: reply delay (ms), p50 | p99", True),
        ("backlog", ("rate",), 1.0, f"backlog of {shape['backlog']['backlog']:,}: drain rate (updates/s)", False),
        ("slow", ("p50_ms", "p99_ms"), 0.001,
         f"slow upstream, {shape['slow']['rate']:g} updates/s, {shape['slow']['handler_wait']:g} s handlers: "
         "reply delay (s), p50 | p99", True),
        ("inflight", ("rss_mb",), 1.0, f"{shape['inflight']['backlog']} handlers in flight: peak RSS (MB)", False),
    ]
    for ax, (workload, keys, scale, title, log) in zip(axes.flat, panels, strict=True):
        shown = [b for b in bots if (workload, b) in figures]
        width = 0.8 / len(keys)
        for j, key in enumerate(keys):
            values = [figures[(workload, b)].get(key, 0.0) * scale for b in shown]
            xs = [i + (j - (len(keys) - 1) / 2) * width for i in range(len(shown))]
            colours = [_COLOURS.get(b.partition("@")[0], "#999999") for b in shown]
            bars = ax.bar(xs, values, width * 0.95, color=colours, alpha=1.0 if j == len(keys) - 1 else 0.55)
            for bar, bot in zip(bars, shown, strict=True):
                if "@" in bot:
                    bar.set_hatch("//")
            for x, v in zip(xs, values, strict=True):
                ax.annotate(f"{v:.0f}" if v >= 10 else f"{v:.1f}", (x, v), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels([label(b, this) for b in shown], fontsize=7)
        ax.set_title(title, fontsize=9)
        if log:
            ax.set_yscale("log")
            plain_numbers = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
            ax.yaxis.set_major_formatter(plain_numbers)
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
    rounds = data.get("rounds", "?")
    fig.suptitle(f"bench/realistic.py: medians of {rounds} rounds, each bot a process against FakeBotAPI",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(target, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, help="the --json output of bench/realistic.py")
    parser.add_argument("png", type=Path, help="where to write the chart")
    parser.add_argument("--this", default="", help="the label of the fences of realistic.py's own checkout")
    args = parser.parse_args()
    draw(json.loads(args.json.read_text()), args.png, args.this)


if __name__ == "__main__":
    main()
