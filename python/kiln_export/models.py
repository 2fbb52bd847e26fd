"""Model builders for the export front end.

Each builder returns (module, example_inputs, spec_extra): an eval-mode
torch.nn.Module, the tuple of example inputs used for torch.export, and a dict
of model-specific fields that go into model_spec.json.
"""
from __future__ import annotations

import torch


class _LogitsOnly(torch.nn.Module):
    """Wraps a HF causal LM so forward(input_ids) returns only the logits tensor."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=False)[0]


def gpt2_config(config: str):
    from transformers import GPT2Config

    if config == "small":
        # The GPT-2 124M configuration (HF "gpt2").
        return "openai-community/gpt2", GPT2Config(
            vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12
        )
    if config == "tiny":
        return "kiln/gpt2-tiny", GPT2Config(
            vocab_size=1000, n_positions=256, n_embd=64, n_layer=2, n_head=4,
            bos_token_id=0, eos_token_id=0,
        )
    raise ValueError(f"unknown gpt2 config '{config}' (expected small or tiny)")


def build_gpt2(config: str, seq_len: int, seed: int, checkpoint: str | None):
    from transformers import GPT2LMHeadModel

    model_id, cfg = gpt2_config(config)
    if seq_len < 1 or seq_len > cfg.n_positions:
        raise ValueError(f"--seq-len {seq_len} outside 1..{cfg.n_positions} for gpt2 {config}")
    cfg.use_cache = False
    # eager attention gives the plain matmul/softmax graph; sdpa would too, but
    # eager is what the reference tutorial exported and is stable across versions.
    cfg._attn_implementation = "eager"
    if checkpoint:
        model = GPT2LMHeadModel.from_pretrained(checkpoint, config=cfg, local_files_only=True)
        model_id = checkpoint
    else:
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(cfg)
    model.eval()
    module = _LogitsOnly(model).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    input_ids = torch.randint(0, cfg.vocab_size, (1, seq_len), dtype=torch.int64, generator=gen)
    return module, (input_ids,), {"model_id": model_id, "config": config,
                                  "vocab_size": cfg.vocab_size}


class _FirstOutput(torch.nn.Module):
    """Wraps a HF model so forward(input_ids) returns its first output tensor only."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, return_dict=False)[0]


def _seeded(cls, cfg, seed, checkpoint):
    # transformers' default attention (SDPA): the graph users export. (GPT-2 keeps
    # eager attention above so its exported program, and kiln's .pte of it, stay as they were.)
    if checkpoint:
        return cls.from_pretrained(checkpoint, config=cfg, local_files_only=True).eval()
    torch.manual_seed(seed)
    return cls(cfg).eval()


def _ids(vocab, seq_len, seed):
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab, (1, seq_len), dtype=torch.int64, generator=gen)


def build_bert(config: str, seq_len: int, seed: int, checkpoint: str | None):
    """A BERT-style encoder (BertModel): forward(input_ids) -> last hidden state."""
    from transformers import BertConfig, BertModel

    if config == "small":
        model_id, cfg = "google-bert/bert-base-uncased", BertConfig()
    elif config == "tiny":
        model_id, cfg = "kiln/bert-tiny", BertConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=256)
    else:
        raise ValueError(f"unknown bert config '{config}' (expected small or tiny)")
    if seq_len < 1 or seq_len > cfg.max_position_embeddings:
        raise ValueError(f"--seq-len {seq_len} outside 1..{cfg.max_position_embeddings} for bert {config}")
    model = _seeded(BertModel, cfg, seed, checkpoint)
    return _FirstOutput(model).eval(), (_ids(cfg.vocab_size, seq_len, seed),), {
        "model_id": checkpoint or model_id, "config": config, "vocab_size": cfg.vocab_size}


def build_llama(config: str, seq_len: int, seed: int, checkpoint: str | None):
    """A Llama-style decoder (LlamaForCausalLM, no KV cache): forward(input_ids) -> logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if config == "small":
        model_id, cfg = "kiln/llama-small", LlamaConfig(
            vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
            num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048)
    elif config == "tiny":
        model_id, cfg = "kiln/llama-tiny", LlamaConfig(
            vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    else:
        raise ValueError(f"unknown llama config '{config}' (expected small or tiny)")
    if seq_len < 1 or seq_len > cfg.max_position_embeddings:
        raise ValueError(f"--seq-len {seq_len} outside 1..{cfg.max_position_embeddings} for llama {config}")
    cfg.use_cache = False
    model = _seeded(LlamaForCausalLM, cfg, seed, checkpoint)
    return _LogitsOnly(model).eval(), (_ids(cfg.vocab_size, seq_len, seed),), {
        "model_id": checkpoint or model_id, "config": config, "vocab_size": cfg.vocab_size}


def _decoder(family: str, config: str, seq_len: int, seed: int, checkpoint: str | None):
    """Qwen3 / Gemma3 decoders (no KV cache): forward(input_ids) -> logits."""
    import transformers as tf

    cls, cfg_cls = {"qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config),
                    "gemma3": (tf.Gemma3ForCausalLM, tf.Gemma3TextConfig)}[family]
    if config == "small":
        model_id, cfg = f"kiln/{family}-small", cfg_cls(
            vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
            num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048)
    elif config == "tiny":
        model_id, cfg = f"kiln/{family}-tiny", cfg_cls(
            vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    else:
        raise ValueError(f"unknown {family} config '{config}' (expected small or tiny)")
    if family == "gemma3" and config == "tiny":
        cfg.sliding_window = 8  # below the usual test lengths: the local layers' masks are bands
    if seq_len < 1 or seq_len > cfg.max_position_embeddings:
        raise ValueError(f"--seq-len {seq_len} outside 1..{cfg.max_position_embeddings} for {family} {config}")
    cfg.use_cache = False
    model = _seeded(cls, cfg, seed, checkpoint)
    return _LogitsOnly(model).eval(), (_ids(cfg.vocab_size, seq_len, seed),), {
        "model_id": checkpoint or model_id, "config": config, "vocab_size": cfg.vocab_size}


def build_qwen3(config: str, seq_len: int, seed: int, checkpoint: str | None):
    return _decoder("qwen3", config, seq_len, seed, checkpoint)


def build_gemma3(config: str, seq_len: int, seed: int, checkpoint: str | None):
    return _decoder("gemma3", config, seq_len, seed, checkpoint)


BUILDERS = {"gpt2": build_gpt2, "bert": build_bert, "llama": build_llama, "qwen3": build_qwen3,
            "gemma3": build_gemma3}
