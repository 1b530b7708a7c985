"""Create or update the saved W&B workspace view that compares the placements of one comparison.

    python -m finetune.dashboard --comparison=bert-base-placements             # --project=lnbert --entity=ME
    python -m finetune.dashboard --comparison=bert-base-placements --dry_run   # build it and print it, offline

The view (wandb-workspaces, the W&B team's library for saved views: ``pip install -e ".[dashboard]"``) shows the
runs of the given ``comparison`` grouped by ``variant`` (``pre``, ``pre-hc4``, ``post-rmsnorm``), one line per
variant (the mean over seeds, with its min-max band): Figure 5, per-layer gradient norms, throughput and MFU, the
designs' claims (generalization gap, sinks, massive activations, over-smoothing, HC's composite gain), fine-tuning loss
and a runs table with the outcome columns (docs/tracking.md). Its name is derived from the
comparison: running the command again updates it instead of adding one.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from finetune.config import check_tasks
from pretrain.common.cli import parse, require, run_cli
from pretrain.tracking.wandb_logging import check_credentials

# Runs-table columns: config:KEY, summary:KEY (a nested summary as KEY.min), run:ATTRIBUTE.
OUTCOME_COLUMNS = ["run:jobType", "config:variant", "config:train.seed", "summary:status", "summary:step",
                   "summary:diverged_at_step", "summary:val/mlm_loss.min", "summary:val/mlm_loss.last",
                   "summary:tokens_seen", "config:task", "config:pretrain_step", "config:lr", "config:seed",
                   "summary:accuracy", "summary:f1"]  # fmt: skip


@dataclass(kw_only=True)
class DashboardConfig:
    """Create or update the W&B workspace view of one comparison of placements."""

    comparison: str
    """The comparison to show: the tracking.comparison the pretraining runs were started with."""
    project: str = "lnbert"
    """W&B project of the runs."""
    entity: str | None = None
    """W&B entity (user or team) of the project; unset: your default entity."""
    tasks: list[str] = field(default_factory=lambda: ["mrpc", "rte"])
    """GLUE tasks with a Figure 5 panel each."""
    name: str | None = None
    """Display name of the view; unset: 'LayerNorm placements: COMPARISON'."""
    dry_run: bool = False
    """Build the view and print what it holds without contacting W&B."""

    def __post_init__(self) -> None:
        require(bool(self.comparison.strip()), "comparison",
                "is empty; pass the runs' tracking.comparison: --comparison=NAME")  # fmt: skip
        check_tasks("tasks", self.tasks)


def _libraries() -> tuple[Any, Any]:
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError:
        raise ValueError(
            "the dashboard needs wandb-workspaces: pip install -e '.[dashboard]' (or pip install wandb-workspaces)"
        ) from None
    return wr, ws


def build_workspace(config: DashboardConfig, entity: str) -> Any:
    """The saved view as a wandb-workspaces ``Workspace`` object (no network)."""
    wr, ws = _libraries()
    mean_band = dict(groupby_aggfunc="mean", groupby_rangefunc="minmax")
    figure5 = [wr.LinePlot(title="(a) validation MLM loss", x="Step", y=["val/mlm_loss"], **mean_band)]
    for panel, task in zip("bcdefgh", config.tasks, strict=False):
        figure5 += [
            wr.ScatterPlot(title=f"({panel}) {task.upper()} dev accuracy of each fine-tuning run vs pretraining step",
                           x=wr.Config("pretrain_step"), y=wr.SummaryMetric(f"{task}/accuracy")),
            wr.LinePlot(title=f"({panel}) {task.upper()}: best lr, mean over seeds (finetune.report)",
                        x="pretrain_step", metric_regex=f"figure5/{task}_accuracy/.*"),
        ]  # fmt: skip
    gradients = [
        wr.LinePlot(title="attention gradient norm per layer", metric_regex=r"grad_norm/layer_\d+/attn"),
        wr.LinePlot(title="FFN gradient norm per layer", metric_regex=r"grad_norm/layer_\d+/ffn"),
        wr.LinePlot(title="global gradient norm (before clipping)", y=["train/grad_norm"], **mean_band),
    ]
    throughput = [
        wr.LinePlot(title="throughput (tokens/s)", y=["train/tokens_per_s"], **mean_band),
        wr.LinePlot(title="model FLOPs utilisation", y=["train/mfu"], **mean_band),
        wr.LinePlot(title="tokens seen", y=["tokens_seen"], **mean_band),
        wr.LinePlot(title="learning rate", y=["train/lr"]),
    ]
    per_layer = {"attention mass on [CLS] per layer": "attention/first_token",
                 "attention mass on [SEP] per layer": "attention/sep",
                 "largest |activation| per layer": "hidden/absmax",
                 "token similarity (over-smoothing) per layer": "hidden/token_similarity",
                 "stream variance per layer": "hidden/variance",
                 "largest attention logit per layer (QK-norm)": "attention/max_logit",
                 "||F|| / ||skip|| per sub-layer (GPAS)": "branch/ratio",
                 "GPAS scale 1 - SiLU(g) per layer": "gpas/scale", "ReZero gate per layer": "rezero/gate",
                 "DyT and Derf alpha per sub-layer": "norm/alpha",
                 "SeeDNorm beta gradient norm per sub-layer": "grad_norm/seednorm_beta"}  # fmt: skip
    claims = [wr.LinePlot(title="validation minus training-split MLM loss", y=["val/generalization_gap"], **mean_band),
              *(wr.LinePlot(title=title, metric_regex=rf"{name}/\d+") for title, name in per_layer.items()),
              wr.LinePlot(title="composite H_res gain (HC family)",
                          y=["residual/composite_gain/row", "residual/composite_gain/col"])]  # fmt: skip
    finetuning = [wr.LinePlot(title="fine-tuning training loss", x="train_step", y=["train/loss"], **mean_band)]
    return ws.Workspace(
        entity=entity, project=config.project, name=config.name or f"LayerNorm placements: {config.comparison}",
        sections=[
            ws.Section(name="Figure 5", panels=figure5, is_open=True),
            ws.Section(name="Gradient norms per layer", panels=gradients, is_open=True),
            ws.Section(name="Throughput and MFU", panels=throughput, is_open=True),
            ws.Section(name="The designs' claims (docs/placements.md)", panels=claims),
            ws.Section(name="Fine-tuning", panels=finetuning),
        ],
        runset_settings=ws.RunsetSettings(filters=[ws.Config("comparison") == config.comparison],
                                          groupby=[ws.Config("variant")], pinned_columns=list(OUTCOME_COLUMNS)),
        settings=ws.WorkspaceSettings(x_axis="Step"),
    )  # fmt: skip


def save_workspace(workspace: Any, comparison: str) -> Any:
    """Create the view under its stable name, or update it when the project already has it."""
    _libraries()  # a clear message when wandb-workspaces is missing
    from wandb_workspaces.workspaces import internal

    name = f"nw-lnbert-{re.sub(r'[^a-z0-9]+', '-', comparison.lower()).strip('-')}-v"  # the ?nw= of the view's URL
    workspace._internal_name = name
    try:
        workspace._internal_id = internal.View.from_name(workspace.entity, workspace.project, name).id
    except ValueError:  # not there yet (or the project has no runs): created under this name
        workspace._internal_id = ""
    return workspace.save()


def describe(workspace: Any) -> str:
    """What the view contains, one line per section and panel (what --dry_run prints)."""
    runset = workspace.runset_settings
    filters = runset.filters if isinstance(runset.filters, str) else " and ".join(map(str, runset.filters))
    lines = [
        f"view '{workspace.name}' in {workspace.entity}/{workspace.project}",
        f"  runs: {filters}; grouped by {', '.join(map(str, runset.groupby))}",
        f"  runs table columns: {', '.join(runset.pinned_columns)}",
    ]
    for section in workspace.sections:
        lines.append(f"  section '{section.name}'")
        for panel in section.panels:
            y = getattr(panel, "metric_regex", None) or getattr(panel, "y", None)
            lines.append(f"    {type(panel).__name__}: {panel.title} (x={getattr(panel, 'x', None)}, y={y})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    config = parse(DashboardConfig, argv, prog="python -m finetune.dashboard", description=__doc__)
    if config.dry_run:
        print(describe(build_workspace(config, config.entity or "ENTITY")))
        return 0
    check_credentials("online", fix="saving a view needs W&B online; --dry_run builds and prints it offline")
    if (entity := config.entity) is None:
        import wandb

        entity = wandb.Api().default_entity
    workspace = save_workspace(build_workspace(config, entity), config.comparison)
    print(describe(workspace))
    print(f"saved: {workspace.url}")
    return 0


cli = functools.partial(run_cli, main)  # bad input: its message and exit code 2, not a traceback


if __name__ == "__main__":
    raise SystemExit(cli())
