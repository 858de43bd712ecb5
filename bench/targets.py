"""The targets `bench.run` reports: what each measures of oars, the reference it is set
against in the same run, and what it asks (a goal on the ratio, on what the figure adds to the
reference, or on the figure itself). One table, here, so that `--list`, the run and
docs/benchmarks.md name the same things."""

from __future__ import annotations

from dataclasses import dataclass

from bench.servers import median, paired, spread


@dataclass(frozen=True)
class Figure:
    """A target's figure and its reference's, medians of the same reps."""

    value: float
    reference: float
    ratios: tuple[float, ...] = ()  # rep by rep

    @property
    def ratio(self) -> float:
        return self.value / self.reference if self.reference else float("nan")

    @classmethod
    def of(cls, values: list[float], references: list[float]) -> Figure:
        return cls(median(values), median(references), tuple(paired(values, references)))


@dataclass(frozen=True)
class Goal:
    """What a target asks: a bound on the ratio, on what the figure adds to its reference
    (`added`, in the figure's unit), or on the figure itself (`value`)."""

    bound: float
    at_least: bool
    on: str = "ratio"

    def measured(self, figure: Figure) -> float:
        """What the goal bounds, of `figure`."""
        return {
            "ratio": figure.ratio,
            "added": figure.value - figure.reference,
            "value": figure.value,
        }[self.on]

    def met(self, figure: Figure) -> bool:
        measured = self.measured(figure)
        return measured >= self.bound if self.at_least else measured <= self.bound

    def text(self, unit: str) -> str:
        sign = "≥" if self.at_least else "≤"
        if self.on == "ratio":
            return f"{sign} {self.bound:.2f}"
        if self.on == "added":
            return f"{sign} +{self.bound:g} {unit} added"
        return f"{sign} {self.bound:g} {unit}"


@dataclass(frozen=True)
class Target:
    key: str
    group: str
    figure: str  # what is measured of oars
    reference: str  # what it is set against, in the same run
    unit: str
    goal: Goal | None  # None: tracked for scale, nothing asked

    @property
    def digits(self) -> int:
        return {"s": 3, "ms": 1, "tok/s": 1}.get(self.unit, 0)


def at_least(bound: float, on: str = "ratio") -> Goal:
    return Goal(bound, True, on)


def at_most(bound: float, on: str = "ratio") -> Goal:
    return Goal(bound, False, on)


RAW, OFF, FREE = "the raw engine loop", "`store: false`", "no constraint"
LLAMA, DIRECT = "llama-server", "the upstream, direct"
F, L, G = "foundation", "llama-server", "gateway"
TARGETS = (
    Target("http", F, "decode through HTTP+SSE", RAW, "tok/s", at_least(0.95)),
    Target("http_ttft", F, "time to first token, HTTP+SSE", RAW, "s", None),
    Target("store", F, "decode, `store: true`", OFF, "tok/s", at_least(0.98)),
    Target("store_ttft", F, "time to first token, `store: true`", OFF, "s", at_most(1.02)),
    Target("json", F, "decode, `json_schema`", FREE, "tok/s", None),
    Target("builder", F, "builder events/s", "scripted engine chunks/s", "/s", None),
    Target("decode", L, "decode, 1 stream", LLAMA, "tok/s", at_least(1.0)),
    Target("prefill", L, "time to first token, 2,000-token prompt", LLAMA, "s", at_most(1.0)),
    Target("streams4", L, "4 streams, aggregate", LLAMA, "tok/s", at_least(1.0)),
    Target("streams16", L, "16 streams, aggregate", LLAMA, "tok/s", at_least(1.0)),
    Target("first16", L, "16 streams, slowest first token", LLAMA, "s", at_most(1.0)),
    Target("agent", L, "an agent's next turn, first token", LLAMA, "s", at_most(1.0)),
    Target("restart", L, "a restarted 8k session, first token", LLAMA, "s", at_most(1, "value")),
    Target("gw_rate", G, "1 stream × 160/s, tokens/s", DIRECT, "/s", at_least(0.98)),
    Target("gw_ttft", G, "1 stream × 160/s, median TTFT", DIRECT, "ms", at_most(5, "added")),
    Target("gw_rate64", G, "64 × 160/s, store on, tokens/s", DIRECT, "/s", at_least(0.98)),
    Target("gw_p99", G, "64 × 160/s, store on, p99 TTFT", DIRECT, "ms", at_most(20, "added")),
    Target("gw_p99_off", G, "64 × 160/s, store off, p99 TTFT", DIRECT, "ms", at_most(20, "added")),
)
Figures = dict[str, Figure]


def render(figures: Figures, groups: list[str]) -> str:
    """The targets of `groups` as a markdown table, with the figures measured (a target with
    none: not run)."""
    lines = [
        "| target | against | oars | reference | ratio | rep by rep | goal | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for target in (t for t in TARGETS if t.group in groups):
        goal = target.goal.text(target.unit) if target.goal else "—"
        found = figures.get(target.key)
        if found is None:
            lines.append(f"| {target.figure} | {target.reference} | | | | | {goal} | |")
            continue
        unit = f" {target.unit}" if target.unit else ""
        value = f"{found.value:,.{target.digits}f}{unit}"
        reference = f"{found.reference:,.{target.digits}f}{unit}"
        verdict = ""
        if target.goal is not None:
            verdict = "met" if target.goal.met(found) else "**not met**"
            if target.goal.on == "added":
                verdict += f" ({target.goal.measured(found):+.{target.digits}f} {target.unit})"
        lines.append(
            f"| {target.figure} | {target.reference} | {value} | {reference} | "
            f"{found.ratio:.3f} | {spread(found.ratios)} | {goal} | {verdict} |"
        )
    return "\n".join(lines)
