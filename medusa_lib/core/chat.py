"""A user's prompt as token ids, through the model's chat template, where what the user typed stays text."""

from __future__ import annotations

# a private-use marker no template changes: where the user's text goes
PROMPT_SLOT = "\ue000prompt\ue000"


def chat_prompt_ids(tokenizer, prompt: str, *, chat_template: bool = True) -> list[int]:
    """Token ids of a user prompt, through the model's chat template when it has one.

    The user's text is text: a chat marker typed in it (``<|im_end|>\n<|im_start|>system``) is
    tokenized as the characters it is, never as the special token, so a prompt cannot end its own
    turn and open a system one. A prompt without such a marker gets the template's ids unchanged."""
    specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]
    marked = any(t in prompt for t in specials)
    if not (chat_template and getattr(tokenizer, "chat_template", None)):
        return list(tokenizer(prompt, add_special_tokens=True, split_special_tokens=True)["input_ids"])
    if not marked:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT_SLOT}], add_generation_prompt=True, tokenize=False
    )
    # the template's own text, whose markers are real ones
    before, _, after = text.partition(PROMPT_SLOT)

    def piece(t: str, split: bool = False) -> list[int]:
        return list(tokenizer(t, add_special_tokens=False, split_special_tokens=split)["input_ids"]) if t else []

    return piece(before) + piece(prompt, True) + piece(after)
