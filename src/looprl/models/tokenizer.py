"""The default tokenizer: byte-level BPE trained with `tokenizers`, plus a chat template that
renders tool calls Hermes/Qwen style (so real Qwen checkpoints and ours share a call format) and
lists each tool as one line in the shape of its call.

    tok = build_tokenizer(texts)          # trained BPE (vocab_size entries)
    tok = build_tokenizer(None)           # bytes only: instant, for tests
    tok.apply_chat_template(messages, tools=schemas, add_generation_prompt=True)
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END]
# Added (not special) tokens: they survive decoding and are single tokens, which makes tool-call
# parsing and think-token counting cheap and unambiguous.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

DEFAULT_SYSTEM = "You are a coding agent working in a repository. Use the tools to inspect and change it."

CHAT_TEMPLATE = (
    # Every literal is emitted through {{ '...' }} so HF's trim_blocks/lstrip_blocks cannot eat newlines.
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set msgs = messages[1:] -%}"
    "{%- else -%}{%- set system = '" + DEFAULT_SYSTEM + "' -%}{%- set msgs = messages -%}{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\nCall tools with <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call>, '"
    " + 'one block per call; several calls per turn are allowed.\\n<tools>' -}}"
    # One line per tool in the shape of its call, then what it does:
    #   {"name": "read_file", "arguments": {"path": string, "offset"?: integer}} Read a text file...
    # The JSON schemas took 1,757 of the default prompt's 1,896 tokens, which every rollout
    # prefills and attends to at each decoded token; these lines take ~800. Lines in the call's
    # own tokens (quoted names, "arguments") and not as signatures (``read_file(path: string)``):
    # a model that copies from its prompt then copies a call.
    "{%- for t in tools -%}"
    "{%- set f = t['function'] if t['function'] is defined else t -%}"
    "{%- set p = f['parameters'] or {} -%}{%- set req = p['required'] or [] -%}"
    "{{- '\\n{\"name\": ' ~ (f['name'] | tojson) ~ ', \"arguments\": {' -}}"
    "{%- for name, s in (p['properties'] or {}).items() -%}"
    "{%- set tp = s['type'] or 'any' -%}"
    "{%- if tp == 'array' -%}{%- set tp = 'array of ' ~ ((s['items'] or {})['type'] or 'any') -%}{%- endif -%}"
    "{%- if s['enum'] is defined -%}{%- set tp = s['enum'] | map('tojson') | join(' | ') -%}{%- endif -%}"
    "{{- (', ' if not loop.first else '') ~ (name | tojson) ~ ('' if name in req else '?') ~ ': ' ~ tp -}}"
    "{%- endfor -%}"
    "{{- '}}' ~ (' ' ~ f['description'] if f['description'] else '') -}}"
    "{%- endfor -%}"
    "{{- '\\n</tools>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for m in msgs -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (m['content'] or '') -}}"
    "{%- for tc in (m['tool_calls'] or []) -%}"
    "{{- '<tool_call>{\"name\": ' + (tc['function']['name'] | tojson) + ', \"arguments\": ' + tc['function']['arguments'] + '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_tokenizer(texts: Iterable[str] | None = None, vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with looprl's special tokens and chat template.

    ``texts=None`` gives a bytes-only tokenizer (256 byte tokens + specials): no training needed.
    """
    tok = Tokenizer(models.BPE())
    # one token per digit (as Llama and Qwen do): a number then reads the same wherever it
    # stands, so "248" in ``path:248:`` (grep) and in ``"offset": 248`` (a call) share tokens
    # and the model can copy it digit by digit (whole-number merges made ":24"+"8" there and
    # " 2"+"4"+"8" here)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size if texts is not None else 0,
        special_tokens=SPECIAL_TOKENS + ADDED_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts if texts is not None else [], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=EOS,
                                   bos_token=None, unk_token=None)
    fast.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    fast.chat_template = CHAT_TEMPLATE
    return fast
