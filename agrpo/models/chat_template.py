"""`model.chat_template` -> the template's text (read by the trainer, the validation pass, the agent checks and eval), and
the one way a run's conversations are rendered to token ids (`TurnRenderer`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agrpo.errors import ConfigError


def resolve_chat_template(name_or_path: str) -> str:
    """The text of a chat template given by TRL's name (a file in trl/chat_templates) or by a .jinja path."""
    from trl import chat_template_utils

    if name_or_path.endswith(".jinja"):
        return Path(name_or_path).expanduser().read_text()
    known = Path(chat_template_utils.__file__).parent / "chat_templates" / f"{name_or_path}.jinja"
    if not known.is_file():
        raise ConfigError(
            f"model.chat_template={name_or_path!r} is neither a .jinja file nor one of TRL's templates "
            f"({', '.join(sorted(p.stem for p in known.parent.glob('*.jinja'))[:8])}, ...)"
        )
    return known.read_text()


def run_template_kwargs(cfg: Any) -> dict[str, Any]:
    """The run's `trainer.extra.chat_template_kwargs` (TRL's GRPOConfig field, passed through), e.g.
    `{enable_thinking: false}`: every render of the run's prompts takes them, in training, the checks and eval."""
    from omegaconf import OmegaConf

    extra = OmegaConf.to_container(cfg.trainer.extra, resolve=True) if cfg.trainer.extra else {}
    return dict((extra or {}).get("chat_template_kwargs") or {})


def response_ready(tokenizer: Any) -> Any:
    """The tokenizer with a response template set (TRL's `add_response_schema`, which knows the common chat templates),
    so replies' tool calls can be parsed; as it is when it has one."""
    from trl.chat_template_utils import add_response_schema

    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        return add_response_schema(tokenizer)
    return tokenizer


class TurnRenderer:
    """A conversation -> the prompt's token ids, as the rollout loop renders every turn (agrpo/trainer/rollout/
    episode.py); the agent data check (agents/prompt_budget.py) and `agrpo eval` (eval/) render with the same object,
    so what they count or sample is what training sees (eval once left out the run's chat_template_kwargs).

    `keep_prefix`: a run whose episodes can call tools needs each turn's render to extend the previous one; where the
    model's own template does not (TRL's `is_chat_template_prefix_preserving`), TRL's training template is used."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None, keep_prefix: bool = True):
        from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

        self.tokenizer = tokenizer
        self.kwargs = dict(template_kwargs or {})
        drifts = keep_prefix and not is_chat_template_prefix_preserving(tokenizer)
        self.chat_template = get_training_chat_template(tokenizer) if drifts else None

    def __call__(self, messages: list[dict[str, Any]], tools: list | None = None, generation: bool = True) -> list[int]:
        return self.tokenizer.apply_chat_template(
            messages,
            return_dict=False,
            add_generation_prompt=generation,
            tools=tools or None,
            chat_template=self.chat_template,
            **self.kwargs,
        )
