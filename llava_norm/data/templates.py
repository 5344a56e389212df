"""What an LLM's chat template reads, found before its tokenizer loads.

Owns ``template_kwargs_problems``: each ``data.template_kwargs`` key that the LLM's chat template
never reads. Jinja renders a template with whatever variables it is given and ignores the rest,
so a misspelt key (``enable_thinkng``) would train and evaluate on prompts without the setting,
silently. The template is read from the LLM's folder or the hub cache (``chat_template.jinja``,
else ``tokenizer_config.json``'s ``chat_template``), as transformers reads it; where neither is
at hand (a hub id the launch downloads) nothing is said.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes

from llava_norm.config_schema import TEMPLATE_KWARGS

# Variables transformers' apply_chat_template sets itself: never the user's to give.
SET_BY_TRANSFORMERS = {"messages", "add_generation_prompt", "tools", "documents", "bos_token", "eos_token",
                       "pad_token", "unk_token", "raise_exception", "strftime_now", "continue_final_message"}


class _Generation(jinja2.ext.Extension):
    """The ``{% generation %}`` block transformers' template environment adds (it marks the
    assistant's tokens): parsed here as its body, which is what it reads."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return jinja2.nodes.Scope(parser.parse_statements(("name:endgeneration",), drop_needle=True))


# Parsed as transformers compiles chat templates: loop controls and the generation block are syntax there.
ENVIRONMENT = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _Generation])


def _template_text(llm: str) -> str | None:
    """The default chat template of ``llm`` (a folder, or a hub id in the cache), or None."""
    folder = Path(llm).expanduser()

    def read(name: str) -> str | None:
        if folder.is_dir():
            path = folder / name
            return path.read_text() if path.is_file() else None
        from huggingface_hub import try_to_load_from_cache  # lazy: only for a hub id

        try:
            cached = try_to_load_from_cache(llm, name)
        except ValueError:  # not a repo id: the backbone check says so
            return None
        return Path(cached).read_text() if isinstance(cached, str) else None

    text = read("chat_template.jinja")
    if text is not None:
        return text
    config = read("tokenizer_config.json")
    try:
        template = json.loads(config).get("chat_template") if config else None
    except (ValueError, AttributeError):  # the tokenizer's own loading says what is wrong with it
        return None
    if isinstance(template, list):  # named templates: apply_chat_template takes "default"
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    elif isinstance(template, dict):  # the same, kept as a mapping of names to templates
        template = template.get("default")
    return template if isinstance(template, str) else None


def template_kwargs_problems(llm: str, kwargs: dict) -> list[str]:
    """One line for each key of ``kwargs`` that the chat template of ``llm`` never reads. The
    default keys (``TEMPLATE_KWARGS``: Llama-3's date) are passed to every template and skipped."""
    asked = [key for key in kwargs if key not in TEMPLATE_KWARGS]
    text = _template_text(llm) if asked else None
    if text is None:
        return []
    try:
        reads = jinja2.meta.find_undeclared_variables(ENVIRONMENT.parse(text))
    except jinja2.TemplateSyntaxError:  # the tokenizer says it when it renders
        return []
    offered = ", ".join(sorted(reads - SET_BY_TRANSFORMERS)) or "none besides transformers' own"
    return [f"key 'data.template_kwargs.{key}': the chat template of {llm} reads no variable {key!r} (the variables "
            f"it reads: {offered})" for key in asked if key not in reads]
