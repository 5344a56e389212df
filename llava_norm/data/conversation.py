"""One tokenisation and masking path for training and evaluation prompts.

Owns: turning a conversation (system/user/assistant messages, ``<image>`` placeholders) into
``input_ids`` and ``labels``. Chat formats are read off the tokenizer's *own* chat template by
rendering sentinel contents, so the text is exactly what ``apply_chat_template`` gives for
any LLM (Llama-3.2, Qwen2.5, ...), with no per-model code. Each piece is tokenised on its own,
so labels are right by construction: assistant contents and the end-of-turn token that closes
them are supervised, nothing else (ANCHORS pain points 1-3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

IMAGE_PLACEHOLDER = "<image>"
IGNORE_INDEX = -100
ROLES = ("system", "user", "assistant")
_SENTINEL = "\ue000{}\ue001"  # private-use code points: never in real text, never trimmed
MAX_PROBES = 4096  # distinct role sequences whose template rendering is kept


@dataclass(frozen=True)
class Segment:
    text: str
    supervised: bool
    is_content: bool  # message content (may hold <image>) as opposed to template text


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]
    n_images: int
    # Token offsets just after each assistant turn (its end-of-turn token included): safe truncation points.
    turn_ends: list[int] = field(default_factory=list)


class ChatTemplateFormat:
    """Segments a conversation with the tokenizer's own chat template.

    template_kwargs are passed to the template (e.g. ``date_string`` for Llama-3, whose
    template otherwise stamps today's date into every sample).
    """

    def __init__(self, tokenizer, template_kwargs: dict | None = None, end_of_turn: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tokenizer has no chat_template; use the 'plain' format or a chat tokenizer")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.end_of_turn = end_of_turn or tokenizer.eos_token
        self._probes: dict[tuple, str] = {}
        probe = self.render([{"role": "user", "content": " " + _SENTINEL.format(0) + " "}], False)
        self.trims_content = " " + _SENTINEL.format(0) + " " not in probe

    @staticmethod
    def row_problem(messages: list[dict]) -> str | None:
        """What would keep a checked row (``data.rows.check_row``) from this format: nothing; the
        template renders any order of roles."""
        return None

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **self.template_kwargs
        )

    def segments(self, messages: list[dict], add_generation_prompt: bool = False) -> list[Segment]:
        # The probe holds sentinels, not contents, so its rendering depends on the roles alone:
        # rendered once per sequence of roles (Jinja costs more than tokenising the row).
        roles = (tuple(m["role"] for m in messages), add_generation_prompt)
        text = self._probes.get(roles)
        if text is None:
            probe = [{"role": m["role"], "content": _SENTINEL.format(i)} for i, m in enumerate(messages)]
            text = self.render(probe, add_generation_prompt)
            if len(self._probes) < MAX_PROBES:
                self._probes[roles] = text
        out: list[Segment] = []
        pos, after_assistant = 0, False
        for i, message in enumerate(messages):
            start = text.find(_SENTINEL.format(i), pos)
            if start < 0:
                raise ValueError(f"chat template dropped message {i} (role {message['role']!r})")
            out.extend(self._template_piece(text[pos:start], after_assistant))
            content = message["content"].strip() if self.trims_content else message["content"]
            out.append(Segment(content, supervised=message["role"] == "assistant", is_content=True))
            after_assistant = message["role"] == "assistant"
            pos = start + len(_SENTINEL.format(i))
        out.extend(self._template_piece(text[pos:], after_assistant))
        return out

    def _template_piece(self, text: str, after_assistant: bool) -> list[Segment]:
        if not after_assistant:
            return [Segment(text, False, False)] if text else []
        if not text.startswith(self.end_of_turn):
            raise ValueError(
                f"chat template does not close an assistant turn with {self.end_of_turn!r} (got {text[:40]!r}); "
                "set end_of_turn in the config"
            )
        cut = len(self.end_of_turn)
        rest = [Segment(text[cut:], False, False)] if text[cut:] else []
        return [Segment(text[:cut], True, False), *rest]


class PlainFormat:
    """LLaVA-1.5's stage-1 'plain' format: bos and the image tokens, then the caption and the
    separator "\n", supervised (``preprocess_plain`` with ``conv_llava_plain``).

    The human instruction is dropped, as LLaVA-1.5 does for feature alignment. The caption ends
    with "\n", not eos, so a stage-1 model is taught no stop token: it is a projector
    pretraining, not a captioner; generation from it runs to ``max_new_tokens``.
    """
    END = "\n"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.bos = tokenizer.bos_token or ""

    @staticmethod
    def row_problem(messages: list[dict]) -> str | None:
        """What keeps a checked row from this format (the data index skips such a row as a bad
        conversation, naming it): the caption must be the turn right after the first user turn."""
        turns = [m for m in messages if m["role"] != "system"]
        if not turns or turns[0]["role"] != "user":
            return "plain format needs a user turn first"
        if len(turns) < 2 or turns[1]["role"] != "assistant":
            return "plain format needs an assistant caption right after the first user turn"
        return None

    def segments(self, messages: list[dict], add_generation_prompt: bool = False) -> list[Segment]:
        turns = [m for m in messages if m["role"] != "system"]
        # a prompt to generate from has no caption yet: only the user turn is asked for
        problem = self.row_problem(turns[:1] + [{"role": "assistant", "content": ""}] if add_generation_prompt
                                   else messages)
        if problem:
            raise ValueError(problem)
        image = IMAGE_PLACEHOLDER if IMAGE_PLACEHOLDER in turns[0]["content"] else ""
        out = [Segment(self.bos + image, False, True)]
        if add_generation_prompt:
            return out
        return out + [Segment(turns[1]["content"].strip(), True, True), Segment(self.END, True, False)]


class ConversationTokenizer:
    """Encodes messages into ids/labels, expanding each ``<image>`` into the model's image tokens."""

    def __init__(self, tokenizer, prompt_format, image_token_id: int, tokens_per_image: int):
        self.tokenizer = tokenizer
        self.format = prompt_format
        self.image_token_id = image_token_id
        self.tokens_per_image = tokens_per_image
        self._template_ids: dict[str, list[int]] = {}  # template text recurs: tokenise it once

    def _ids(self, segment: Segment) -> list[int]:
        if not segment.is_content:
            if segment.text not in self._template_ids:
                self._template_ids[segment.text] = self.tokenizer.encode(segment.text, add_special_tokens=False)
            return self._template_ids[segment.text]
        ids = self.tokenizer.encode(segment.text, add_special_tokens=False)
        if self.image_token_id not in ids:
            return ids
        expanded: list[int] = []
        for token in ids:
            expanded.extend([token] * self.tokens_per_image if token == self.image_token_id else [token])
        return expanded

    def encode(self, messages: list[dict], add_generation_prompt: bool = False) -> Encoded:
        encoded = Encoded([], [], n_images=sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages))
        segments = self.format.segments(messages, add_generation_prompt)
        for index, segment in enumerate(segments):
            ids = self._ids(segment)
            encoded.input_ids.extend(ids)
            encoded.labels.extend(ids if segment.supervised else [IGNORE_INDEX] * len(ids))
            if _closes_turn(segments, index):
                encoded.turn_ends.append(len(encoded.input_ids))
        return encoded

    def encoded_lengths(self, conversations: list[list[dict]], max_length: int, chunk: int = 4096) -> list[int]:
        """Exactly ``len(truncate(encode(messages), max_length).input_ids)`` for each
        conversation, 0 where even the first turn does not fit, with the same per-segment
        tokenisation as ``encode`` but batched. Packing (``data.packing``) needs lengths that
        never fall short of the real ones, which ``count_tokens`` does not promise."""
        return [fitted_length(total, ends, max_length) for total, ends in self.encoded_turn_ends(conversations, chunk)]

    def encoded_turn_ends(self, conversations: list[list[dict]], chunk: int = 4096) -> list[tuple[int, list[int]]]:
        """For each conversation, the length ``encode`` gives it before truncation and the length
        at the end of each assistant turn (where ``truncate`` may cut): what ``fitted_length``
        turns into the exact length at any ``max_length``. The row index keeps them (packing)."""
        out: list[tuple[int, list[int]]] = []
        for start in range(0, len(conversations), chunk):
            part = [self.format.segments(messages) for messages in conversations[start:start + chunk]]
            texts = [s.text for segments in part for s in segments if s.is_content]
            ids = iter(self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
            for segments in part:
                length, turn_ends = 0, []
                for index, segment in enumerate(segments):
                    if segment.is_content:
                        row = next(ids)
                        length += len(row) + row.count(self.image_token_id) * (self.tokens_per_image - 1)
                    else:
                        length += len(self._ids(segment))
                    if _closes_turn(segments, index):
                        turn_ends.append(length)
                out.append((length, turn_ends))
        return out

    def render_text(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return "".join(s.text for s in self.format.segments(messages, add_generation_prompt))

    def count_tokens(self, conversations: list[list[dict]], chunk: int = 8192) -> list[int]:
        """Length each conversation will have once encoded (image tokens included), for length
        grouping. Renders every conversation and tokenises the texts in batched fast-tokenizer
        calls, about half the cost of ``encode``; equal to it except where a token would merge
        across a template boundary (rare, a token or two)."""
        lengths: list[int] = []
        for start in range(0, len(conversations), chunk):
            part = conversations[start:start + chunk]
            texts = [self.render_text(messages) for messages in part]
            ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
            for messages, row_ids in zip(part, ids):
                n_images = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages)
                lengths.append(len(row_ids) + n_images * (self.tokens_per_image - 1))
        return lengths


def fitted_length(total: int, turn_ends: list[int], max_length: int) -> int:
    """The length ``truncate`` leaves at ``max_length``: all of it, else up to the last turn end
    that fits, else 0 (not even the first turn fits)."""
    if total <= max_length:
        return total
    fitting = [end for end in turn_ends if end <= max_length]
    return fitting[-1] if fitting else 0


def _closes_turn(segments: list[Segment], index: int) -> bool:
    """Whether segment ``index`` ends an assistant turn (a safe truncation point)."""
    return segments[index].supervised and (index + 1 == len(segments) or not segments[index + 1].supervised)


def truncate(encoded: Encoded, max_length: int) -> Encoded | None:
    """Cut at the last whole assistant turn that fits; None if even the first does not fit.

    Cutting only at turn ends never splits image tokens (they sit in the first user turn)
    and never leaves a sample with no supervised token.
    """
    if len(encoded.input_ids) <= max_length:
        return encoded
    fitting = [end for end in encoded.turn_ends if end <= max_length]
    if not fitting:
        return None
    end = fitting[-1]
    return Encoded(encoded.input_ids[:end], encoded.labels[:end], encoded.n_images,
                   [e for e in encoded.turn_ends if e <= end])


# data.prompt_format (config_schema.PROMPT_FORMATS) -> its class, whose row_problem reads a row alone
FORMAT_CLASSES = {"plain": PlainFormat, "chat": ChatTemplateFormat}


def make_prompt_format(tokenizer, name: str, template_kwargs: dict | None = None):
    if name == "plain":
        return PlainFormat(tokenizer)
    if name == "chat":
        return ChatTemplateFormat(tokenizer, template_kwargs)
    raise ValueError(f"prompt format must be 'chat' or 'plain', got {name!r}")


def conversation_tokenizer(bundle, prompt_format: str = "chat", template_kwargs: dict | None = None):
    config = bundle.model.config
    return ConversationTokenizer(bundle.tokenizer, make_prompt_format(bundle.tokenizer, prompt_format, template_kwargs),
                                 config.image_token_id, config.image_seq_length)
