"""Tiny Llamas for the sparse-KV, long-context and budget-robust draft tests: the model and its
token ids, the oracle attention a sparse draft is checked against, planted copies, and the
`train` Llama source."""

import torch
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import repeat_kv

from decodelab.engines.longctx import TruePositions
from decodelab.engines.sparse_kv import sparse_view
from decodelab.engines.speculative import feed

VOCAB = 64
ORACLE = {}  # the selection the oracle attention masks to, and the context length it covers


def tiny_llama(seed=0, vocab=VOCAB):
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def tokens(n, seed=0, vocab=VOCAB):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def oracle_attention(module, query, key, value, attention_mask, scaling, **kwargs):
    """Eager attention over the full cache, blocking the prefix positions outside the selection
    of this layer and KV head (and the future)."""
    ORACLE.setdefault("queries", {})[module.layer_idx] = query[0, :, -1]
    selection, n = ORACLE["selection"][module.layer_idx], ORACLE["n"]
    total, q_len = key.shape[2], query.shape[2]
    allowed = torch.zeros(selection.shape[0], q_len, total, dtype=torch.bool)
    allowed[:, :, n:] = torch.ones(q_len, total - n, dtype=torch.bool).tril(total - q_len - n)
    allowed[torch.arange(selection.shape[0])[:, None], :, selection] = True
    allowed = allowed.repeat_interleave(module.num_key_value_groups, dim=0)[None]
    groups = module.num_key_value_groups
    scores = query @ repeat_kv(key, groups).transpose(2, 3) * scaling
    weights = scores.masked_fill(~allowed, -torch.inf).softmax(-1)
    return (weights @ repeat_kv(value, groups)).transpose(1, 2).contiguous(), weights


AttentionInterface.register("sparse_oracle", oracle_attention)


def draft_logits(model, cache, selection, ids):
    """Logits of feeding `ids` one at a time on the selection's view, at true positions."""
    drafter = TruePositions(model, cache.get_seq_length())
    view = sparse_view(cache, selection)
    return torch.stack([feed(drafter, view, torch.tensor([t]))[-1] for t in ids])


def planted_copies(n, period, seed):
    """n sequences of `period` random tokens written twice: the second half is predictable
    only from the token `period` - 1 positions back, outside any recent window."""
    first = torch.randint(1, COPY_VOCAB, (n, period), generator=torch.Generator().manual_seed(seed))
    return torch.cat([first, first], 1)


COPY_VOCAB, PERIOD = 32, 48

LLAMA = {"source": "train", "arch": "llama", "n_layer": 1, "n_embd": 32, "n_head": 2,
         "n_positions": 64, "vocab_size": 320, "corpus_mb": 0.4, "seq_len": 32,
         "batch_size": 4, "steps": 20, "lr": 0.01, "seed": 1}
