"""What became of a short pretraining run, and where the outcome changes across a grid of runs.

Pure functions over numbers read from a run (its status, training-loss curve, final validation loss) and
two references computed from its data (``unigram_reference`` in probes.py), so every rule is unit-tested on
synthetic curves. The rules, in the order they are applied:

- **diverged**: the run stopped on a non-finite loss or gradient (RUN/status.json ``diverged``, at a step).
- **blew up**: no NaN, but the loss rose far above the unigram plateau and stayed there: every training MLM
  loss logged in the last ``tail_fraction`` of the run is more than ``blowup_margin`` nats above both the
  unigram entropy of the training tokens and the lowest training loss the run had logged before.
- **failed to train**: the final validation MLM loss is not at least ``trained_margin`` nats below the
  unigram cross-entropy of the validation tokens (the loss of the best model that ignores context: it predicts
  every masked token from the training tokens' frequencies). The run never left the plateau.
- **trained**: the rest; the final validation MLM loss says how well.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Outcome = Literal["diverged", "blew up", "failed to train", "trained", "incomplete"]
OUTCOMES: tuple[Outcome, ...] = ("trained", "failed to train", "blew up", "diverged", "incomplete")
SHORT = {"trained": "", "failed to train": "plateau ", "blew up": "blew up ", "diverged": "div@", "incomplete": "?"}


@dataclass(frozen=True, kw_only=True)
class Rules:
    """The thresholds of the outcome rules (module docstring)."""

    trained_margin: float = 0.1
    """Nats below the validation unigram cross-entropy the final validation loss must reach to count as trained."""
    blowup_margin: float = 1.0
    """Nats above the unigram entropy and above the run's best loss that the end of the loss curve must stay."""
    tail_fraction: float = 0.1
    """Share of the logged training steps, at the end, that must all stay above the blow-up threshold."""


def blew_up(train_losses: Sequence[float], train_unigram_entropy: float, rules: Rules) -> bool:
    """The end of the curve (``tail_fraction`` of the points, at least one) stays more than ``blowup_margin``
    nats above the unigram entropy and above the lowest loss logged before that tail."""
    n_tail = max(1, round(rules.tail_fraction * len(train_losses)))
    if len(train_losses) <= n_tail:
        return False  # no "before" to have risen from
    head, tail = train_losses[:-n_tail], train_losses[-n_tail:]
    floor = max(train_unigram_entropy, min(head)) + rules.blowup_margin
    return min(tail) > floor


def classify(*, status: str, train_losses: Sequence[float], val_loss: float | None,
             train_unigram_entropy: float | None, val_unigram_cross_entropy: float | None, rules: Rules) -> Outcome:
    """The outcome of one run (module docstring), from its status, its logged training MLM losses in step
    order, its final validation MLM loss and the unigram references of its data."""
    if status == "diverged":
        return "diverged"
    if status != "finished" or val_loss is None or train_unigram_entropy is None or val_unigram_cross_entropy is None:
        return "incomplete"
    if blew_up(train_losses, train_unigram_entropy, rules):
        return "blew up"
    if val_loss > val_unigram_cross_entropy - rules.trained_margin:
        return "failed to train"
    return "trained"


def combine(outcomes: Iterable[Outcome]) -> Outcome | Literal["seeds differ"]:
    """One outcome for a cell's seeds: theirs when they agree (incomplete seeds are left out while another
    seed has finished), else "seeds differ"."""
    done = [o for o in dict.fromkeys(outcomes) if o != "incomplete"]
    if not done:
        return "incomplete"
    return done[0] if len(done) == 1 else "seeds differ"


def boundary(outcome_of: Mapping[tuple, str], axes: Sequence[Sequence]) -> set[tuple]:
    """Settings next to a change of outcome: ``outcome_of`` maps a setting (one value per axis, in the order
    of ``axes``) to its combined outcome; a setting is on the boundary when its seeds differ or when a
    neighbour, one step away along one axis (the next or previous value of that axis's list, or any other
    value of an unordered axis such as the placement), has another outcome. Incomplete settings are ignored."""
    known = {s: o for s, o in outcome_of.items() if o != "incomplete"}
    found = {s for s, o in known.items() if o == "seeds differ"}
    for setting, outcome in known.items():
        for axis, values in enumerate(axes):
            i = list(values).index(setting[axis])
            ordered = not isinstance(values[0], str)  # placements are categories: every other one is a neighbour
            others = [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)] if ordered else list(values)
            for value in others:
                neighbour = (*setting[:axis], value, *setting[axis + 1 :])
                if neighbour in known and known[neighbour] != outcome:
                    found |= {setting, neighbour}
    return found
