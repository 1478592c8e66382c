"""`model.chat_template` -> the template's text: read by the trainer, the validation pass, the agent checks and eval."""

from __future__ import annotations

from pathlib import Path

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
