"""W&B conventions shared by pretraining, fine-tuning and the Figure 5 report.

- **Groups pool, tags and config compare.** W&B draws a group as one mean line, so a group holds only runs that may
  be averaged: one recipe and placement, different seeds. The comparison (``tracking.comparison``) is a tag and a
  config key; the placement is the config key ``norm_placement`` in every run type (pretrain, finetune, report).
- **One W&B run per pretraining run,** however often it is preempted: its id is kept in ``RUN/wandb_run.json``.
- **Outcomes in the summary:** ``status``, ``diverged_at_step``, the best and last ``val/mlm_loss``; one name per
  metric (W&B's end-of-run printout leaves out those two, a dict; the run's own last lines give the loss).
- **Lineage:** snapshots are model artifacts by reference (``file://``, nothing uploaded), aliased ``step-N``.

``wandb`` is imported inside the functions: a run without W&B tracking never loads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from pretrain.common.atomic import write_json
from pretrain.common.roles import by_section, keys_where
from pretrain.config import PretrainConfig
from pretrain.run_folder.layout import SNAPSHOT_INFO, WANDB_DIR, WANDB_RUN_FILE, run_folder_of

SUMMARY_LINES = 40
"""Summary values W&B prints when a run ends: its default (10, in key order) hides val/* behind the train/* keys."""
# Fields that do not change what a run learns (pretrain/common/roles.py: seed, paths, cadence, how the batch is split
# over devices, ...), by section; everything else in the resolved config is the recipe.
_NOT_RECIPE = by_section(keys_where(PretrainConfig, lambda rules: not rules.recipe))


class WandbCredentialsError(ValueError):
    """W&B would log online but has no credentials (a bad-input error: exit code 2, nothing started)."""


def wandb_mode(configured: str = "online") -> str:
    """The mode W&B will use: the WANDB_MODE environment variable wins over the configured one."""
    return os.environ.get("WANDB_MODE", configured)


def check_credentials(mode: str, run_dir: str | Path = "RUN", fix: str | None = None) -> None:
    """Fail before any work when W&B would log online without credentials (it would stop the run later, or
    prompt for a key on a cluster node). Reads WANDB_API_KEY, ~/.netrc and W&B's settings; no network."""
    if mode in ("offline", "disabled", "dryrun"):
        return
    import wandb

    if wandb.setup().settings.mode in ("offline", "disabled", "dryrun"):  # `wandb offline` in this directory
        return
    if not wandb.login(verify=False, prompt=False):
        fix = fix or (
            f"or log offline: WANDB_MODE=offline now, `wandb sync {Path(run_dir) / WANDB_DIR}/offline-run-*` later; "
            "or turn W&B off (--tracking.backend=none for pretraining, no --wandb for fine-tuning and the report)"
        )
        login = "Log in once with `wandb login` (or set WANDB_API_KEY)"
        raise WandbCredentialsError(f"no W&B credentials found. {login}; {fix}.")


def short_hash(payload: Any, length: int = 8) -> str:
    """A stable short hash of a JSON-able value (dict keys sorted)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:length]


def recipe(resolved: dict[str, Any], global_batch_size: int) -> dict[str, Any]:
    """The part of a resolved pretraining config that changes what is learned (model, data, optimizer, steps, global
    batch): runs that differ only in seeds, paths, cadence or batch split share a recipe and a W&B group."""
    out = {
        section: {k: v for k, v in resolved[section].items() if k not in _NOT_RECIPE.get(section, set())}
        for section in ("model", "data", "optim", "train")
    }
    out["train"]["global_batch_size"] = global_batch_size
    return out


def pretrain_group(tracking: dict[str, Any], placement: str, recipe_hash: str) -> str:
    """``tracking.group`` when set, else ``{comparison}-{placement}-{recipe hash}``: a group pools only seeds."""
    return str(tracking.get("group") or f"{tracking.get('comparison') or 'lnbert'}-{placement}-{recipe_hash}")


def read_run_file(run_dir: str | Path) -> dict[str, Any]:
    """RUN/wandb_run.json ({} when the run never logged to W&B)."""
    path = Path(run_dir) / WANDB_RUN_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def run_identity(run_dir: Path, resume_from: Path | None, group: str, project: str) -> dict[str, Any]:
    """The W&B run this pretraining run logs to, written to RUN/wandb_run.json before the run starts: a new id for a
    new run; resumed from its own checkpoint, the id in RUN/wandb_run.json (one W&B run, one curve); continued from
    another run's checkpoint (the 512-token phase), that run's id and group, so the phase extends its curve."""
    identity = {}
    if resume_from is not None:
        source = run_folder_of(resume_from)
        own = source == Path(run_dir).resolve()
        identity = read_run_file(run_dir) if own else {**read_run_file(source), "continued_from": str(source)}
    if not identity.get("id"):
        # W&B run ids are [a-z0-9]; 12 random hex digits never collide within a project in practice.
        identity = {"id": secrets.token_hex(6), "group": group, "project": project}
    write_json(Path(run_dir) / WANDB_RUN_FILE, identity)
    return identity


def snapshot_artifact_name(wandb_run_id: str) -> str:
    """One artifact per pretraining run; each snapshot is a version, aliased step-N."""
    return f"snapshot-{wandb_run_id}"


def snapshot_artifact(snapshot_dir: str | Path, wandb_run_id: str) -> Any:
    """A W&B model artifact referencing the snapshot's files (``file://``, checksummed, not uploaded)."""
    import wandb

    path = Path(snapshot_dir).resolve()
    info = json.loads((path / SNAPSHOT_INFO).read_text())
    artifact = wandb.Artifact(
        snapshot_artifact_name(wandb_run_id),
        type="model",
        description=f"weights-only snapshot of {info.get('run_name')} at step {info['step']}",
        metadata={k: info.get(k) for k in ("step", "tokens_seen", "run_name", "norm_placement", "metrics")},
    )
    artifact.add_reference(path.as_uri(), checksum=True)
    return artifact


def snapshot_alias(step: int) -> str:
    return f"step-{step}"
