"""Gemma 4 text decoders (transformers' Gemma4ForCausalLM) for `python -m kiln_export llm --arch gemma4`.

The model is transformers' own; this module gives it configurations (tiny, E2B's, E4B's) and a KV cache that
fits a program with static shapes:

- layers that share KV (the last `num_kv_shared_layers`) own no cache: they read the keys and values of the last
  earlier layer of their type, as transformers computes them (its `shared_kv_states`);
- a global (full-attention) layer owns a cache of max_seq_len positions, written at the absolute positions;
- a sliding-window layer owns a ring of R = min(max_seq_len, window + chunk - 1) positions, written at
  position mod R, where chunk is the most tokens one call takes (1 without --dynamic, so R is the window). A
  call writes its rows first and then attends: with R >= window + chunk - 1 no row of the call overwrites a
  position one of its queries still needs. Each slot's absolute position follows from the last position
  written (slot s holds last - ((last - s) mod R)), and the masks are built from those absolute positions:
  a query at position i sees key position j when j <= i and i - j < window (transformers' sliding window).

The masks are given to the model as transformers' own per-layer-type mask mapping (additive, 0 or the dtype's
minimum), so transformers' attention, RoPE, norms and KV sharing run unchanged.
"""
from __future__ import annotations

CONFIGS = ("tiny", "e2b", "e4b")


def config(name: str):
    """Gemma4TextConfig for `name`: tiny (every feature of E2B at width 64, seconds to export), or E2B's / E4B's
    public text configuration."""
    from transformers import Gemma4TextConfig

    if name == "tiny":
        # 5 layers: sliding, sliding, global, then two KV-shared ones (a sliding layer reusing layer 1's KV and
        # a global one reusing layer 2's); head_dim 16 on sliding layers and 32 on global ones, 4 query heads
        # and 1 KV head, partial RoPE (0.25 of 32) on global layers, double-wide MLP on shared layers,
        # per-layer input embeddings of 32 per layer (a torchao int4 group), q/k/v norms, soft-capping, tied
        # embeddings; a window of 8 positions, so a few dozen decode steps go round the ring several times.
        # A vocabulary of 512: a SentencePiece-style tokenizer with byte fallback (Gemma's) has the 256 byte
        # tokens, its special tokens and some merges.
        # The soft-capping is at 1.0, not E2B's 30: random weights give logits below 1, where
        # tanh(x / 30) * 30 is x to 1e-4 and a test could not tell whether the capping ran.
        return Gemma4TextConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=5,
                                num_attention_heads=4, num_key_value_heads=1, head_dim=16, global_head_dim=32,
                                layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                             "sliding_attention", "full_attention"],
                                sliding_window=8, num_kv_shared_layers=2, use_double_wide_mlp=True,
                                hidden_size_per_layer_input=32, vocab_size_per_layer_input=512,
                                final_logit_softcapping=1.0, max_position_embeddings=4096, rms_norm_eps=1e-6,
                                tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    if name == "e2b":
        layers, pattern = 35, 5  # 4 sliding + 1 global
        extra = dict(hidden_size=1536, intermediate_size=6144, num_key_value_heads=1, num_kv_shared_layers=20,
                     use_double_wide_mlp=True)
    elif name == "e4b":
        layers, pattern = 42, 6  # 5 sliding + 1 global
        extra = dict(hidden_size=2560, intermediate_size=10240, num_key_value_heads=2, num_kv_shared_layers=18,
                     use_double_wide_mlp=False)
    else:
        raise ValueError(f"--config {name}: gemma4 has the configurations {', '.join(CONFIGS)}")
    return Gemma4TextConfig(vocab_size=262144, num_hidden_layers=layers, num_attention_heads=8, head_dim=256,
                            global_head_dim=512,
                            layer_types=["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                                         for i in range(layers)],
                            sliding_window=512, hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144,
                            final_logit_softcapping=30.0, max_position_embeddings=131072, rms_norm_eps=1e-6,
                            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, pad_token_id=0,
                            eos_token_id=1, bos_token_id=2, **extra)


def build(name: str, seed: int, attn_implementation: str, device: str = "cpu", dtype=None):
    """Gemma4ForCausalLM with seeded random weights, built directly in `dtype` (by default fp32 for tiny, bf16 for
    E2B / E4B, their deployed size; device "meta" builds the modules without their storage)."""
    import torch
    from transformers import Gemma4ForCausalLM

    cfg = config(name)
    cfg._attn_implementation = attn_implementation
    if dtype is None:
        dtype = torch.float32 if name == "tiny" else torch.bfloat16
    torch.manual_seed(seed)
    with torch.device(device):
        model = Gemma4ForCausalLM._from_config(cfg, dtype=dtype)
    return model.eval()


def cache_plan(cfg, max_seq_len: int, chunk: int):
    """[(layer, kind, positions, kv_heads, head_dim)] for the layers that own a cache."""
    modes = cfg.kv_sharing_modes
    plan = []
    for i, kind in enumerate(cfg.layer_types):
        if modes[i] == "reuse":
            continue
        lc = cfg.per_layer_config[i]
        if kind == "sliding_attention":
            plan.append((i, "sliding", min(max_seq_len, cfg.sliding_window + chunk - 1), lc.num_key_value_heads,
                         lc.head_dim))
        else:
            plan.append((i, "full", max_seq_len, lc.num_key_value_heads, lc.head_dim))
    return plan


def make_module(model, max_seq_len: int, last_logits_only: bool, external: bool = False, chunk: int = 1):
    """The export wrapper: forward(tokens[1, T], input_pos[T], *caches) -> logits, T <= chunk."""
    import torch
    from transformers.cache_utils import Cache, DummyLayer

    cfg = model.config
    window = cfg.sliding_window
    dtype = model.dtype
    plan = cache_plan(cfg, max_seq_len, chunk)

    class _Layer:
        """One layer's cache: keys/values [1, kv_heads, R, head_dim], rows written in place at position mod R."""

        is_sliding = False
        is_compileable = True

        def __init__(self, size):
            self.size = size
            self.keys = self.values = self.slots = None

        def update(self, key_states, value_states, *args, **kwargs):
            self.keys.index_copy_(2, self.slots, key_states)
            self.values.index_copy_(2, self.slots, value_states)
            return self.keys, self.values

    text = model.model

    def kv_shared_inputs(hidden_states, per_layer_inputs, position_embeddings, causal_mask_mapping, logits_to_keep,
                         cache=None, **kwargs):
        # transformers' own narrowing of the KV-shared layers to the kept rows, without its `seq_len == 1`
        # shortcut (a guard on the token count, which --dynamic leaves symbolic)
        if not isinstance(logits_to_keep, int) or logits_to_keep <= 0:
            return hidden_states, per_layer_inputs, position_embeddings, causal_mask_mapping
        keep = slice(-logits_to_keep, None)
        return (hidden_states[:, keep], per_layer_inputs[:, keep],
                {k: (c[:, keep], s[:, keep]) for k, (c, s) in position_embeddings.items()},
                {k: m[:, :, keep] for k, m in causal_mask_mapping.items()})

    text._maybe_slice_kv_shared_inputs = kv_shared_inputs

    class Gemma4WithCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.plan = plan
            self.window = window
            self.ring = {kind: size for _, kind, size, _, _ in plan}
            layers = [DummyLayer() for _ in range(cfg.num_hidden_layers)]
            self.cache_shapes, self.cache_names, self.owned = [], [], []
            for layer, kind, size, heads, head_dim in plan:
                layers[layer] = _Layer(size)
                shape = (1, heads, size, head_dim)
                for what in ("key", "value"):
                    name = f"{what}_cache_{layer}"
                    self.cache_names.append(name)
                    if external:  # the caller's tensors, inputs after tokens and input_pos
                        self.cache_shapes.append(shape)
                    else:  # the program's state (mutable buffers)
                        self.register_buffer(name, torch.zeros(shape, dtype=dtype), persistent=False)
                self.owned.append(layer)
            self.cache = Cache(layers=layers)
            self.cache_dtype = dtype

        def forward(self, tokens, input_pos, *caches):
            if len(caches) != (len(self.cache_shapes) if external else 0):
                raise ValueError(f"expected {len(self.cache_shapes)} cache tensors, got {len(caches)}")
            if not external:
                caches = tuple(getattr(self, n) for n in self.cache_names)
            last = input_pos[-1:]
            q = input_pos.unsqueeze(1)  # [T, 1]
            masks, slots = {}, {}
            minimum = torch.finfo(self.cache_dtype).min
            for kind, size in self.ring.items():
                j = torch.arange(size, dtype=torch.long)
                if kind == "sliding":
                    slots[kind] = torch.remainder(input_pos, size)
                    kpos = (last - torch.remainder(last - j, size)).unsqueeze(0)  # absolute position per slot
                    ok = (kpos <= q) & (kpos > q - self.window) & (kpos >= 0)
                else:
                    slots[kind] = input_pos
                    ok = j.unsqueeze(0) <= q
                masks[kind + "_attention"] = torch.where(ok, 0.0, minimum).to(self.cache_dtype)[None, None]
            for n, (layer, kind, _, _, _) in enumerate(self.plan):
                cl = self.cache.layers[layer]
                cl.keys, cl.values, cl.slots = caches[2 * n], caches[2 * n + 1], slots[kind]
            out = self.model(input_ids=tokens, attention_mask=masks, position_ids=input_pos.unsqueeze(0),
                             cache=self.cache, use_cache=True, logits_to_keep=1 if last_logits_only else 0)
            return out.logits

    return Gemma4WithCache().eval()


def build_deferred(name: str, seed: int, attn_implementation: str, dtype=None):
    """(model, materialize): the model of `build` with the weights of its linear and embedding layers as fake
    tensors (shapes and dtypes, no storage: torch.export traces them), everything else real (transformers' own
    initialisation: norms, layer scalars, embedding scales, RoPE frequencies). `materialize(fqn, fake)` gives a
    fake weight's values when the archive is written (kiln_export/pt2_writer.py), one at a time: seeded
    normal(0, initializer_range) in the model's dtype, generated directly in it. Peak memory: the largest
    weight plus the small tensors, not the model (E2B: 9.3 GB in bf16)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = build(name, seed, attn_implementation, device="meta", dtype=dtype)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes: dict = {}  # id(meta parameter) -> fake parameter (tied weights stay one tensor)
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
            for pname, p in list(m.named_parameters(recurse=False)):
                if id(p) not in fakes:
                    with fake_mode:
                        fakes[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype), requires_grad=False)
                setattr(m, pname, fakes[id(p)])
            for bname, b in list(m.named_buffers(recurse=False)):
                m._buffers[bname] = torch.empty_like(b, device="cpu")
                if bname == "embed_scale" and hasattr(m, "scalar_embed_scale"):  # Gemma's scaled embeddings
                    m._buffers[bname].fill_(m.scalar_embed_scale)
                else:
                    raise NotImplementedError(f"{type(m).__name__}.{bname}: no deferred initialisation for it")
        else:
            m.to_empty(device="cpu", recurse=False)
            model._init_weights(m)
    std = model.config.initializer_range
    order: dict = {}

    def materialize(fqn: str, fake):
        i = order.setdefault(id(fake), len(order))
        g = torch.Generator().manual_seed(seed * 1_000_003 + i)
        return torch.empty(fake.shape, dtype=fake.dtype).normal_(0.0, std, generator=g)

    return model.eval(), materialize
