"""The sizes of `pivotrl reproduce`: quick (the machinery, in the test suite), cpu and gpu.

Every experiment runs at every scale; only the sizes change. `quick` uses a randomly initialised
two-layer model of SmolLM2's architecture (with SmolLM2's tokenizer), so its numbers say nothing
about the method: it checks that every stage runs, resumes and reports. `cpu` is the real
small-scale run (SmolLM2-135M-Instruct, every bundled domain, about 3 hours on 2 cores); `gpu`
the same with more of everything for one GPU (a bigger model through --policy).

A scale holds the configs its stages run with, instances of their own classes (`SFTConfig`,
`ProfileConfig`, `FilterConfig`, `GRPOConfig`) made from the bases below, so a setting a scale
does not change keeps its class's default. The stages record a scale flat (`Scale.to_dict`), under
the names of `CONFIG_SIZES`, which `--set` takes too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pivot_envs.adapters.grpo.config import GRPOConfig
from pivot_envs.adapters.reproduce.measure import ENV_WORKERS
from pivot_envs.adapters.sft import SFTConfig
from pivot_envs.config import ConfigError, UnknownOptionError
from pivot_envs.errors import UnknownNameError
from pivot_envs.extract import FilterConfig
from pivot_envs.profile import ProfileConfig

TINY = "tiny"  # the quick scale's random model (see measure.load_policy)

# What every scale's arms and profiles share. The arms are measured once trained: no checkpoint, no
# evaluation inside the run.
TRAIN = GRPOConfig(checkpoint_every=0, eval_every=0, num_envs=ENV_WORKERS)
PROFILE = ProfileConfig(seed=0, batch_pivots=4, env_workers=ENV_WORKERS)

# The configs' fields a scale sets, by the name its stages record them under (and --set takes): stages
# finished earlier, the committed benchmarks/stages/ among them, stay valid while these names and values do.
# max_new_tokens bounds the actions profiled, trained on and measured alike.
CONFIG_SIZES: dict[str, tuple[str, ...]] = {
    "base_epochs": ("warm_up.epochs",),
    "base_learning_rate": ("warm_up.learning_rate",),
    "k": ("profile.k",),
    "lambda_diff": ("filter.lambda_diff",),
    "steps": ("train.steps",),
    "batch_pivots": ("train.batch_pivots",),
    "group_size": ("train.group_size",),
    "learning_rate": ("train.learning_rate",),
    "max_new_tokens": ("train.max_new_tokens", "profile.max_new_tokens"),
    "sft_epochs": ("sft.epochs",),
    "sft_learning_rate": ("sft.learning_rate",),
}
CONFIGS = ("warm_up", "profile", "filter", "train", "sft")


def _get(scale: Any, path: str) -> Any:
    config, name = path.split(".")
    return getattr(getattr(scale, config), name)


@dataclass(frozen=True)
class Scale:
    """The sizes of one scale and the configs of its stages. Counts of pivots are per domain; 0 means all."""

    name: str
    policy: str  # TINY or a policy spec (hf:smollm2, hf:PATH)
    device: str
    domains: tuple[str, ...]  # bundled domains measured (signal, miss rate, OOD)
    train_domains: tuple[str, ...]  # domains the training arms train in (one run per domain, seed, arm)
    seeds: int  # training seeds (0 .. seeds-1)
    heldout: float  # fraction of each domain's trajectories held out
    eval_pivots: int  # held-out pivots evaluated per domain (greedy; 0: all)
    ood_pivots: int  # another domain's held-out pivots evaluated for drift
    base_examples: int  # expert turns per domain in the warm-up SFT (part A)
    candidates: int  # part-B candidates profiled and trained at, per training domain
    ks: tuple[int, ...]  # the zero-variance fraction is also given at each of these k (each within profile.k)
    wiki_texts: int  # Wikipedia summaries whose loss is measured before and after
    wiki_tokens: int  # tokens of each summary scored
    questions: int  # general questions with exact answers asked (0: all bundled)
    warm_up: SFTConfig  # the base: SFT on part A's expert turns
    profile: ProfileConfig  # part B's candidates profiled under the base (K samples each)
    filter: FilterConfig  # D_adv from the profile (lambda_diff)
    train: GRPOConfig  # every RL arm (steps, B, G, learning rate, action length)
    sft: SFTConfig  # the SFT arm on part B's expert turns
    max_prompt_tokens: int = 1024
    # domains profiled for the signal and miss-rate claims (besides the training domains, always profiled);
    # () profiles every measured domain
    profile_domains: tuple[str, ...] = ()
    # held-out pivots of each training domain the arms are evaluated and compared on (None: the domain's
    # eval_pivots sample; 0: every held-out pivot). The base's measurements and the drift sets keep eval_pivots.
    compared_pivots: int | None = None
    progress: bool = True  # progress bars inside the stages (profiling, SFT); quick runs in the tests without
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        for name, paths in CONFIG_SIZES.items():
            if len({_get(self, path) for path in paths}) > 1:
                shown = ", ".join(f"{path}={_get(self, path)}" for path in paths)
                raise ConfigError(f"scale {self.name}: {shown} must be one value ({name})")

    def to_dict(self) -> dict[str, Any]:
        """The scale as its stages record it (their settings digests are taken over it): its own fields and
        the configs' fields it sets, flat, under the names of CONFIG_SIZES."""
        own = {item.name: getattr(self, item.name) for item in fields(self) if item.name not in CONFIGS}
        return {**own, **{name: _get(self, paths[0]) for name, paths in CONFIG_SIZES.items()}}


# A random model learns only with large steps.
RANDOM_MODEL_LEARNING_RATE = 1e-3
# lambda_diff of every scale: the paper gives no value.
FILTER = FilterConfig(lambda_diff=0.9)

SCALES = {
    "quick": Scale(
        name="quick",
        policy=TINY,
        device="cpu",
        domains=("tool-use", "search"),
        train_domains=("tool-use",),
        seeds=3,
        heldout=0.25,
        eval_pivots=8,
        ood_pivots=4,
        base_examples=6,
        candidates=6,
        ks=(2, 4),
        wiki_texts=4,
        wiki_tokens=48,
        questions=6,
        warm_up=SFTConfig(learning_rate=RANDOM_MODEL_LEARNING_RATE),
        profile=replace(PROFILE, k=4, max_new_tokens=6),
        filter=FILTER,
        train=replace(
            TRAIN,
            steps=2,
            batch_pivots=2,
            group_size=4,
            learning_rate=RANDOM_MODEL_LEARNING_RATE,
            max_new_tokens=6,
        ),
        sft=SFTConfig(learning_rate=RANDOM_MODEL_LEARNING_RATE),
        # the prompt's cost is the random model's: its vocabulary projection dominates each forward
        max_prompt_tokens=256,
        progress=False,
        notes=("a random two-layer model: the numbers check the machinery, not the method",),
    ),
    "cpu": Scale(
        name="cpu",
        policy="hf:smollm2",
        device="cpu",
        domains=("tool-use", "search", "terminal", "swe"),
        # search alone: the base's profile there is mostly mixed (tool-use's is mostly unsolved), and one
        # training domain keeps the run within its budget of 2 cores
        train_domains=("search",),
        seeds=3,
        heldout=0.3,
        eval_pivots=32,
        ood_pivots=8,
        base_examples=32,
        candidates=32,
        ks=(4, 8),
        wiki_texts=30,
        wiki_tokens=128,
        questions=30,
        warm_up=SFTConfig(),
        profile=replace(PROFILE, max_new_tokens=48),
        filter=FILTER,
        train=replace(TRAIN, steps=4, batch_pivots=2, learning_rate=2e-5, max_new_tokens=48),
        sft=SFTConfig(epochs=2),
        # terminal and SWE are measured out of domain only: profiling them took the longest (sandboxed
        # execution) and the base never succeeds at a SWE pivot
        profile_domains=("tool-use", "search"),
        notes=(
            "sized for about 2 hours on 2 shared cores: held-out sets of 32 pivots per domain decide only "
            "differences of about 35 points (see each claim's MDD)",
            "the signal and miss-rate claims profile tool-use and search; terminal and SWE are measured out of "
            "domain only",
        ),
    ),
    "gpu": Scale(
        name="gpu",
        policy="hf:smollm2",
        device="cuda",
        domains=("tool-use", "search", "terminal", "swe"),
        # search, as at the cpu scale: the 135M base's tool-use candidates are nearly all uniformly failed (15 of
        # 16 at K=8 on an H200), so training there has nothing to learn; a bigger --policy can --set train_domains
        train_domains=("search",),
        # sized from an H200 run of this scale shrunk with --set (docs/reproduce.md): about 4 hours on one GPU,
        # spent on seeds and steps, as the cpu scale's 15-seed run showed seed-to-seed spread, not the held-out
        # size, limits its comparisons
        seeds=10,
        heldout=0.3,
        eval_pivots=0,
        ood_pivots=0,
        base_examples=64,
        candidates=64,
        ks=(4, 8, 16),
        wiki_texts=200,
        wiki_tokens=256,
        questions=0,
        warm_up=SFTConfig(epochs=2),
        profile=replace(PROFILE, k=16, max_new_tokens=64),
        filter=FILTER,
        train=replace(TRAIN, steps=20, batch_pivots=8, learning_rate=1e-5, max_new_tokens=64),
        sft=SFTConfig(epochs=2),
        max_prompt_tokens=2048,
        # terminal and SWE are measured (in their sandboxes) but not profiled: the 135M base never succeeds there
        profile_domains=("tool-use", "search"),
        notes=(
            "sized for about 4 hours on one GPU, estimated from the stage times of a shrunk run on an H200, not "
            "run at this size",
        ),
    ),
}


# fields --set may not change: the scale's name keys its default output folder, its notes are prose
_FIXED = ("name", "notes")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse_field(field_name: str, kind: str, text: str) -> Any:
    """`text` as a value of a Scale field whose annotation is `kind` (the module's annotations are strings)."""
    where = f"--set {field_name}={text}"
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "bool":
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
            raise ConfigError(f"{where}: expected one of {', '.join(_TRUE + _FALSE)}")
        if kind == "int | None":
            return None if text.lower() == "none" else int(text)
        if kind.startswith("tuple[int"):
            return tuple(int(item) for item in text.split(",") if item.strip())
        if kind.startswith("tuple[str"):
            return tuple(item.strip() for item in text.split(",") if item.strip())
    except ValueError as error:
        if str(error).startswith(where):
            raise
        raise ConfigError(f"{where}: expected {kind}, got {text!r}") from None
    return text


def set_fields(scale: Scale, items: Sequence[str]) -> Scale:
    """`scale` with FIELD=VALUE items applied (`--set steps=20 --set ks=4,8`): any field but the name, the notes
    and the configs, or a config's field by its CONFIG_SIZES name; tuples are comma-separated. The report's
    notes list what was set, so its reader sees which sizes are not the named scale's."""
    kinds = _kinds(scale)
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"--set expects FIELD=VALUE, got {item!r}")
        if key not in kinds:
            raise UnknownOptionError("scale field", key, sorted(kinds))
        changes[key] = _parse_field(key, kinds[key], text.strip())
    if not changes:
        return scale
    _check_sizes(changes)
    scale = with_sizes(scale, changes)
    if any(not 1 <= k <= scale.profile.k for k in scale.ks):
        raise ConfigError(
            f"--set: ks {_shown(scale.ks)} must lie within 1..k (k={scale.profile.k}): the zero-variance share "
            f"at each is read from the k samples profiled (--set ks=...)"
        )
    if not set(scale.train_domains) <= set(scale.domains):
        raise ConfigError(
            f"--set: the training domains {', '.join(scale.train_domains)} must be among the measured domains "
            f"{', '.join(scale.domains)}"
        )
    shown = ", ".join(f"{key}={_shown(value)}" for key, value in changes.items())
    return replace(scale, notes=(*scale.notes, f"sizes set on the command line: {shown}"))


def _kind(annotation: Any) -> str:
    """A field's annotation as its module writes it (`int`, `tuple[int, ...]`, `int | None`). A dataclass
    field holds that text, unless something resolved it to the type: building a command's parser does
    (simple_parsing), for the config classes a scale holds."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type) and not getattr(annotation, "__args__", None):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _kinds(scale: Scale) -> dict[str, str]:
    """The annotation of each size --set may change: the scale's own fields and the configs' of CONFIG_SIZES."""
    kinds = {item.name: _kind(item.type) for item in fields(Scale) if item.name not in (*_FIXED, *CONFIGS)}
    for name, (path, *_) in CONFIG_SIZES.items():
        config, key = path.split(".")
        kinds[name] = next(_kind(item.type) for item in fields(getattr(scale, config)) if item.name == key)
    return kinds


def with_sizes(scale: Scale, changes: dict[str, Any]) -> Scale:
    """`scale` with `changes` by size name (a field of the scale, or a config's field by its CONFIG_SIZES name)."""
    own = {key: value for key, value in changes.items() if key not in CONFIG_SIZES}
    configs: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        for path in CONFIG_SIZES.get(key, ()):
            config, name = path.split(".")
            configs.setdefault(config, {})[name] = value
    replaced = {config: replace(getattr(scale, config), **values) for config, values in configs.items()}
    return replace(scale, **own, **replaced)


def _shown(value: Any) -> str:
    return ",".join(str(item) for item in value) if isinstance(value, tuple) else str(value)


def _check_sizes(changes: dict[str, Any]) -> None:
    positive = ("seeds", "k", "steps", "batch_pivots", "group_size", "max_new_tokens", "max_prompt_tokens")
    for key in positive:
        if key in changes and changes[key] < 1:
            raise ConfigError(f"--set {key} must be at least 1, got {changes[key]}")
    for key, value in changes.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ConfigError(f"--set {key} must not be negative, got {value}")
    if "heldout" in changes and not 0 < changes["heldout"] < 1:
        raise ConfigError(f"--set heldout must be between 0 and 1, got {changes['heldout']}")


def get_scale(
    name: str,
    seeds: int | None = None,
    domains: tuple[str, ...] | None = None,
    policy: str | None = None,
    device: str | None = None,
    compared_pivots: int | None = None,
    sets: Sequence[str] = (),
) -> Scale:
    """The named scale, with --set, --seeds, --domains, --policy, --device and --compared-pivots applied (training
    stays in the scale's training domains that are among `domains`, else in the first of them; the named
    options win over --set)."""
    if name not in SCALES:
        raise UnknownNameError("scale", name, sorted(SCALES))
    scale = set_fields(SCALES[name], sets)
    if seeds is not None:
        if seeds < 1:
            raise ConfigError(f"--seeds must be at least 1, got {seeds}")
        scale = replace(scale, seeds=seeds)
    if domains:
        kept = tuple(d for d in scale.train_domains if d in domains) or domains[:1]
        scale = replace(scale, domains=tuple(domains), train_domains=kept)
    if policy:
        scale = replace(scale, policy=policy)
    if device:
        scale = replace(scale, device=device)
    if compared_pivots is not None:
        if compared_pivots < 0:
            raise ConfigError(
                f"--compared-pivots must be 0 (all held-out pivots) or more, got {compared_pivots}"
            )
        scale = replace(scale, compared_pivots=compared_pivots)
    return scale
