"""Chat data for fine-tuning: conversations -> (input_ids, labels) with the model's chat
template and assistant-only labels.

The template is the tokenizer's own Jinja chat template (tokenizer_config.json /
chat_template.jinja, or a GGUF's tokenizer.chat_template), rendered the way transformers'
apply_chat_template renders it (sandboxed Jinja, trim_blocks, lstrip_blocks); without one,
the family is told by the special tokens: ChatML (<|im_start|>: SmolLM2, Qwen) or
Llama-2's [INST] (<s> / </s>).

Labels: every token is ignore_index except each assistant message's content and the end
token that closes it (<|im_end|> / </s>).  They are next-token shifted here, as the LLM demo
does (demo_llm.chunks): the compiled loss is plain cross_entropy(logits[b, t], labels[b, t])
(no shift inside the model, unlike Hugging Face's causal-LM loss), so with the
conversation's tokens x0 x1 ... xL,
    input_ids[b, t] = x_t,  labels[b, t] = x_{t+1} if x_{t+1} is an assistant token else ignore_index,
padded on the right (input pad_id, label ignore_index) or truncated to seq_len.
"""
from __future__ import annotations

import numpy as np

from ..errors import PockError


# Used when the tokenizer brings no chat template of its own: the two families chat_batch
# knows by their special tokens (ChatML: SmolLM2, Qwen; [INST]: Llama-2, Mistral).
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                   "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                   "{% endif %}")
LLAMA2_TEMPLATE = ("{% if messages[0]['role'] == 'system' %}{% set system = '<<SYS>>\\n' + messages[0]['content'] + "
                   "'\\n<</SYS>>\\n\\n' %}{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
                   "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
                   "(system if loop.first else '') + message['content'].strip() + ' [/INST]' }}"
                   "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'].strip() + ' ' + eos_token }}"
                   "{% endif %}{% endfor %}")

def _render(template: str, messages, special: dict, add_generation_prompt: bool = False) -> str:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                **special)
    except TemplateError as e:
        raise PockError(f"chat template: {e}") from None


def template_for(tok) -> tuple[str, str]:
    """(Jinja template, the text of the token closing an assistant message)."""
    chatml = tok.token_to_id("<|im_end|>") is not None and tok.token_to_id("<|im_start|>") is not None
    template = tok.chat_template
    if template is None:
        if chatml:
            template = CHATML_TEMPLATE
        elif tok.bos_id is not None and tok.eos_id is not None:
            template = LLAMA2_TEMPLATE
        else:
            raise PockError("chat_batch: the tokenizer has no chat template and neither ChatML's <|im_start|>/"
                            "<|im_end|> nor BOS/EOS tokens to choose one")
    if chatml and "<|im_end|>" in template:
        return template, "<|im_end|>"
    if tok.eos_id is None:
        raise PockError("chat_batch: the tokenizer has no end-of-sequence token to close assistant messages")
    return template, tok.id_to_token(tok.eos_id)


def _check(conversations) -> None:
    if not isinstance(conversations, (list, tuple)) or not conversations:
        raise PockError("chat_batch: conversations must be a non-empty list of conversations")
    for i, conv in enumerate(conversations):
        if not isinstance(conv, (list, tuple)) or not conv:
            raise PockError(f"chat_batch: conversation {i} is not a non-empty list of messages")
        for j, m in enumerate(conv):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise PockError(f"chat_batch: conversation {i} message {j} is not a dict with str 'role' and 'content'")


def assistant_spans(tok, messages) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the [start, stop) character spans of what the model
    learns: each assistant message's content and the end token closing it."""
    template, end = template_for(tok)
    special = {"bos_token": tok.id_to_token(tok.bos_id) if tok.bos_id is not None else "",
               "eos_token": tok.id_to_token(tok.eos_id) if tok.eos_id is not None else ""}
    full = _render(template, messages, special)
    spans, pos = [], 0
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = _render(template, messages[:k], special) if k else ""
        upto = _render(template, messages[:k + 1], special)
        if not full.startswith(upto) or not upto.startswith(head):
            raise PockError("chat_batch: the chat template does not render a conversation's prefix as a prefix "
                            "of the whole (cannot find the assistant messages)")
        start = max(len(head), pos)
        content = m["content"]
        at = upto.find(content, start) if content.strip() else -1
        if at < 0 and content.strip():
            content = content.strip()  # templates that strip the content (Llama-2)
            at = upto.find(content, start)
            if at < 0:
                raise PockError(f"chat_batch: assistant message {k}'s content is not in the rendered template")
        if at < 0:  # empty content: only the end token is learned
            at, content = start + len(upto[start:]) - len(upto[start:].lstrip()), ""
        stop = at + len(content)
        close = upto.find(end, stop)
        if close >= 0 and not upto[stop:close].strip():
            stop = close + len(end)
        spans.append((at, stop))
        pos = stop
    return full, spans


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def tokens_and_targets(tok, messages) -> tuple[list[int], list[bool]]:
    """The conversation's token ids (the whole rendered text encoded at once, as
    apply_chat_template does) and which of them are assistant targets.  A span's first
    token is the first token where encoding the text up to the span and the whole text
    part ways, so a token straddling the boundary (SentencePiece's '▁6') counts as the
    span's."""
    full, spans = assistant_spans(tok, messages)
    ids = tok.encode(full, add_special_tokens=False)
    target = [False] * len(ids)
    for start, stop in spans:
        a = _common_prefix(tok.encode(full[:start], add_special_tokens=False), ids)
        b = _common_prefix(tok.encode(full[:stop], add_special_tokens=False), ids)
        for i in range(a, b):
            target[i] = True
    return ids, target


def chat_batch(tok, conversations, seq_len: int, ignore_index: int = -100):
    """(input_ids, labels): int64 arrays [len(conversations), seq_len] (see the module doc)."""
    if not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise PockError(f"chat_batch: seq_len must be a positive int, got {seq_len!r}")
    _check(conversations)
    pad = tok.pad_id if tok.pad_id is not None else tok.eos_id if tok.eos_id is not None else 0
    x = np.full((len(conversations), seq_len), pad, np.int64)
    y = np.full((len(conversations), seq_len), ignore_index, np.int64)
    for b, conv in enumerate(conversations):
        ids, target = tokens_and_targets(tok, list(conv))
        n = min(len(ids) - 1, seq_len)
        if n <= 0:
            continue
        x[b, :n] = ids[:n]
        nxt = np.asarray(ids[1:n + 1], np.int64)
        y[b, :n] = np.where(np.asarray(target[1:n + 1], bool), nxt, ignore_index)
    return x, y
