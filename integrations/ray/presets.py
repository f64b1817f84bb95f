"""Which Ray actor is which participant: role rules by actor class name (and actor name).

A preset is an ordered list of rules; the first rule whose ``class`` pattern matches the actor's
class name (and whose ``name`` pattern, if given, matches the actor's name) gives its role. The
rank comes from the actor name's ``rank`` group, else from its ``group`` and ``local`` groups
(ordered as numbers), else from the order of the actor ids within the role (stable while Ray
keeps the actors listed; it is not the framework's own rank).

Patterns are RE2 (``recovery.user_regex``: linear time, no lookarounds or backreferences, at
most ``MAX_PATTERN_CHARS`` characters), so a preset file cannot stall the agent or the hook
that evaluates it against every actor. A preset file (YAML or JSON) has the shipped presets'
shape; ``docs/integrations.md`` (sections 4 and 5) shows one and names the verl and OpenRLHF
commits and files the shipped presets were checked against.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery.user_regex import UserRegex, UserRegexError, compile_user_regex

# The server's rule for role names (ingest contract): letters, digits and _.:@/- .
_ROLE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@/-]{0,63}$")
# The longest class or name pattern a preset may hold (the shipped ones are under 120).
MAX_PATTERN_CHARS = 500
#: The named groups of a rule's name match (``rank``, ``group``, ``local``); empty without one.
NameGroups = dict[str, str | None]


class PresetError(ValueError):
    """A preset that cannot be used; the message names the preset and the bad value."""


@dataclass(frozen=True, slots=True)
class RoleRule:
    """Actors whose class (and name, if given) match are participants of ``role``."""

    role: str
    class_pattern: UserRegex
    name_pattern: UserRegex | None = None

    def matches(self, class_name: str, actor_name: str) -> NameGroups | None:
        """None when the actor is not this role's; else the name match's named groups."""
        if self.class_pattern.search(class_name) is None:
            return None
        if self.name_pattern is None:
            return {}
        return self.name_pattern.search(actor_name)


@dataclass(frozen=True, slots=True)
class Preset:
    """A framework's role rules, tried in order."""

    name: str
    rules: tuple[RoleRule, ...]
    # What a resubmission through the Jobs API adds to the entrypoint so the framework resumes
    # from its newest checkpoint (``key=value`` replaces a given ``key=``; a flag is added once).
    resume_args: tuple[str, ...] = ()

    def role_of(self, class_name: str, actor_name: str) -> tuple[str, NameGroups] | None:
        """``(role, the name match's named groups)`` of the first rule that matches, or None."""
        for rule in self.rules:
            groups = rule.matches(class_name, actor_name)
            if groups is not None:
                return rule.role, groups
        return None


def _rule(role: str, class_pattern: str, name_pattern: str | None = None) -> dict[str, str]:
    out = {"role": role, "class": class_pattern}
    if name_pattern is not None:
        out["name"] = name_pattern
    return out


# verl: the colocated WorkerDict holds actor, rollout and reference in one process (the
# trainer); a reward model served by the async server is named vllm_server_reward_*.
_VERL_RANK = r"_(?P<group>\d+):(?P<local>\d+)$"
_VERL = {
    "name": "verl",
    # verl/trainer/config/ppo_trainer.yaml: resume_mode auto = the newest checkpoint in
    # trainer.default_local_dir
    "resume": ["trainer.resume_mode=auto"],
    "roles": [
        _rule("reward", r"^(vLLMHttpServer|SGLangHttpServer|TRTLLMHttpServer)", r"_reward_"),
        _rule(
            "rollout",
            r"^(vLLMHttpServer|SGLangHttpServer|TRTLLMHttpServer)",
            r"_server_(?P<rank>\d+)_",
        ),
        _rule("rollout", r"^(vLLMHttpServer|SGLangHttpServer|TRTLLMHttpServer)"),
        _rule("rollout", r"^(DetachAsyncRolloutWorker|AgentLoopWorker|FullyAsyncAgentLoopWorker)$"),
        _rule("critic", r"^CriticWorker$", _VERL_RANK),
        _rule("critic", r"^CriticWorker$"),
        _rule("reward", r"^(RewardModelWorker|RewardLoopWorker)$", _VERL_RANK),
        _rule("reward", r"^(RewardModelWorker|RewardLoopWorker)$"),
        _rule(
            "trainer",
            r"^(WorkerDict|FusedWorker\w*|ActorRolloutRefWorker|AsyncActorRolloutRefWorker"
            r"|TrainingWorker|DetachActorWorker)$",
            _VERL_RANK,
        ),
        _rule(
            "trainer",
            r"^(WorkerDict|FusedWorker\w*|ActorRolloutRefWorker|AsyncActorRolloutRefWorker"
            r"|TrainingWorker|DetachActorWorker)$",
        ),
    ],
}

_OPENRLHF = {
    "name": "openrlhf",
    # openrlhf/cli/train_ppo_ray.py (line 294 at the commit above): --ckpt.load_enable loads
    # the checkpoint under --ckpt.path (older releases called it --load_checkpoint)
    "resume": ["--ckpt.load_enable"],
    "roles": [
        _rule("trainer", r"^PolicyModelActor$"),
        _rule("critic", r"^CriticModelActor$"),
        _rule("reference", r"^ReferenceModelActor$"),
        _rule("reward", r"^RewardModelActor$"),
        _rule("rollout", r"^RolloutRayActor$"),
    ],
}

SHIPPED: dict[str, dict[str, Any]] = {"verl": _VERL, "openrlhf": _OPENRLHF}


def _compile(where: str, key: str, text: Any) -> UserRegex:
    if not isinstance(text, str) or not text:
        raise PresetError(f"{where}: {key!r} must be a non-empty regular expression, got {text!r}")
    try:
        return compile_user_regex(
            text, max_chars=MAX_PATTERN_CHARS, limit_name="a preset's MAX_PATTERN_CHARS"
        )
    except UserRegexError as exc:
        raise PresetError(f"{where}: {key} {text!r} is not a regular expression: {exc}") from None


def preset_from_dict(doc: Any, source: str) -> Preset:
    """Validate a preset document; :class:`PresetError` names the first bad value."""
    if not isinstance(doc, dict):
        raise PresetError(f"preset {source}: must be a mapping with 'name' and 'roles'")
    unknown = sorted(set(doc) - {"name", "roles", "resume"})
    if unknown:
        raise PresetError(
            f"preset {source}: unknown key {unknown[0]!r} (known: name, roles, resume)"
        )
    resume = doc.get("resume", [])
    if not isinstance(resume, list) or not all(isinstance(a, str) and a for a in resume):
        raise PresetError(f"preset {source}: 'resume' must be a list of arguments, got {resume!r}")
    roles = doc.get("roles")
    if not isinstance(roles, list) or not roles:
        raise PresetError(f"preset {source}: 'roles' must be a non-empty list of rules")
    rules: list[RoleRule] = []
    for index, item in enumerate(roles):
        where = f"preset {source}: roles[{index}]"
        if not isinstance(item, dict):
            raise PresetError(f"{where}: must be a mapping with 'role' and 'class'")
        extra = sorted(set(item) - {"role", "class", "name"})
        if extra:
            raise PresetError(f"{where}: unknown key {extra[0]!r} (known: role, class, name)")
        role = item.get("role")
        if not isinstance(role, str) or not _ROLE.fullmatch(role):
            raise PresetError(f"{where}: role {role!r} is not a valid role name")
        name = item.get("name")
        rules.append(
            RoleRule(
                role,
                _compile(where, "class", item.get("class")),
                None if name is None else _compile(where, "name", name),
            )
        )
    name = doc.get("name", source)
    return Preset(str(name), tuple(rules), tuple(resume))


def with_resume(entrypoint: str, resume_args: tuple[str, ...]) -> str:
    """``entrypoint`` with the resume arguments: ``key=value`` replaces a given ``key=…``
    (Hydra overrides, as verl takes them), ``--option=value`` replaces a given
    ``--option=…`` or ``--option VALUE`` (argparse's two spellings; the reference job's
    ``--resume=auto``), a flag is added unless it is there."""
    words = shlex.split(entrypoint)
    for arg in resume_args:
        if "=" in arg:
            option = arg.split("=", 1)[0]
            words = _without_option(words, option, takes_value=option.startswith("-"))
            words.append(arg)
        elif arg not in words:
            words.append(arg)
    return shlex.join(words)


def _without_option(words: list[str], option: str, *, takes_value: bool) -> list[str]:
    """``words`` less ``option=…`` and, for an option that takes a value, ``option VALUE``."""
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word.startswith(option + "="):
            continue
        elif takes_value and word == option:
            skip = True  # the next word is its value
        else:
            out.append(word)
    return out


def load_preset(spec: str) -> Preset:
    """``verl``, ``openrlhf``, or the path of a YAML/JSON preset file."""
    if spec in SHIPPED:
        return preset_from_dict(SHIPPED[spec], spec)
    path = Path(spec)
    if not path.suffix or not path.exists():
        raise PresetError(
            f"unknown Ray preset {spec!r} (shipped: {', '.join(sorted(SHIPPED))}, "
            f"or the path of a YAML/JSON preset file)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PresetError(f"cannot read Ray preset file {spec!r}: {exc.strerror}") from None
    try:
        if path.suffix.lower() == ".json":
            doc = json.loads(text)
        else:
            import yaml

            doc = yaml.safe_load(text)
    except ValueError as exc:  # json.JSONDecodeError and yaml.YAMLError's message both help
        raise PresetError(f"Ray preset file {spec!r} is not valid: {exc}") from None
    except Exception as exc:  # yaml.YAMLError is not a ValueError
        raise PresetError(f"Ray preset file {spec!r} is not valid YAML: {exc}") from None
    return preset_from_dict(doc, spec)
