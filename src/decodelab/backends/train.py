"""The `train` model source: a small GPT-2 (or, with `arch: llama`, a rotary-position Llama for
long contexts) trained here, on the running Python's standard library. A drafter may train with
a sparse-cache `objective` instead of next-token loss (budgetdraft.py).

Every machine that runs decodelab has that corpus, so draft/target pairs with meaningful
acceptance can be made offline. The corpus differs between Python versions; its SHA-256 is
recorded so that a reader can tell which one a model saw.
"""

from __future__ import annotations

import hashlib
import math
import platform
import shutil
import sys
import sysconfig
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from decodelab.backends.devices import backend_problem, claim_gpu, device_name
from decodelab.backends.models import count_parameters, load, read_manifest, write_manifest
from decodelab.config.settings import draft_objective
from decodelab.core.errors import DecodelabError
from decodelab.engines import budgetdraft

EOT = "<|endoftext|>"
# Not code a model should learn from: vendored packages, tests, generated codec tables, pydoc's
# dump of the docs, and the 2to3 / IDLE trees.
EXCLUDED_DIRS = frozenset({
    "site-packages", "dist-packages", "test", "tests", "idle_test", "idlelib", "lib2to3",
    "encodings", "pydoc_data", "turtledemo", "__pycache__",
})
HELDOUT_EVERY = 20  # a file is held out when the hash of its path is 0 modulo this
EVAL_WINDOWS = 64   # the fixed held-out sample: evenly spaced windows of EVAL_LEN tokens
EVAL_LEN = 256
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

REQUIRED = {
    "source": str, "n_layer": int, "n_embd": int, "n_head": int, "n_positions": int,
    "vocab_size": int, "corpus_mb": (int, float), "seq_len": int, "batch_size": int,
    "steps": int, "lr": (int, float), "seed": int,
}
OPTIONAL = {"teacher": str, "distill": (int, float), "init": str, "dropout": (int, float),
            "eval_every": int, "device": str, "arch": str,
            # a drafter's sparse-cache objective: config.DraftObjective, budgetdraft.py
            "objective": str, "continuation": int, "budgets": list, "budget_weights": list,
            "sparse_weight": (int, float), "sparse_policy": str}
ARCHS = ("gpt2", "llama")
INITS = ("random", "teacher")

Files = list[tuple[str, bytes]]  # (path relative to the stdlib, contents)


# spec


def validate(spec: dict, teacher_dir: Path | None) -> None:
    def bad(key: str, why: str) -> DecodelabError:
        return DecodelabError(f"train model spec: key {key!r} {why}")

    for key in spec:
        if key not in REQUIRED and key not in OPTIONAL:
            raise bad(key, f"is unknown; known: {', '.join([*REQUIRED, *OPTIONAL])}")
    for key in REQUIRED:
        if key not in spec:
            raise bad(key, "is missing")
    for key, kind in (REQUIRED | OPTIONAL).items():
        if key in spec and (isinstance(spec[key], bool) or not isinstance(spec[key], kind)):
            raise bad(key, f"must be a {getattr(kind, '__name__', 'number')}, "
                           f"not {spec[key]!r}")
    if spec["source"] != "train":
        raise bad("source", f"must be 'train', not {spec['source']!r}")
    for key in ("n_layer", "n_embd", "n_head", "n_positions", "seq_len", "batch_size", "steps"):
        if spec[key] < 1:
            raise bad(key, f"must be >= 1, not {spec[key]}")
    for key in ("corpus_mb", "lr"):
        if spec[key] <= 0:
            raise bad(key, f"must be > 0, not {spec[key]}")
    if spec["n_embd"] % spec["n_head"]:
        raise bad("n_head", f"must divide n_embd ({spec['n_embd']}), not {spec['n_head']}")
    if spec["seq_len"] > spec["n_positions"]:
        raise bad("seq_len", f"({spec['seq_len']}) must be <= n_positions ({spec['n_positions']})")
    if spec["vocab_size"] < 257:
        raise bad("vocab_size", f"must be > 256 (the byte alphabet), not {spec['vocab_size']}")
    if not 0 <= spec.get("distill", 0) <= 1:
        raise bad("distill", f"must be in [0, 1], not {spec['distill']}")
    if "distill" in spec and "teacher" not in spec:
        raise bad("distill", "needs a 'teacher' to distill from")
    if not 0 <= spec.get("dropout", 0) < 1:
        raise bad("dropout", f"must be in [0, 1), not {spec['dropout']}")
    if "dropout" in spec and spec.get("arch", "gpt2") != "gpt2":
        raise bad("dropout", "applies to arch gpt2 only")
    if spec.get("eval_every", 1) < 1:
        raise bad("eval_every", f"must be >= 1, not {spec['eval_every']}")
    if spec.get("init", "random") not in INITS:
        raise bad("init", f"must be one of {', '.join(INITS)}, not {spec['init']!r}")
    if spec.get("init") == "teacher" and "teacher" not in spec:
        raise bad("init", "'teacher' needs a 'teacher' to copy from")
    if spec.get("arch", "gpt2") not in ARCHS:
        raise bad("arch", f"must be one of {', '.join(ARCHS)}, not {spec['arch']!r}")
    if spec.get("device", "cpu") not in ("cpu", "cuda", "mps"):
        raise bad("device", f"must be cpu, cuda or mps, not {spec['device']!r}")
    if "teacher" in spec and teacher_dir is None:
        raise bad("teacher", f"names {spec['teacher']!r} but no teacher directory was given")
    if drafting := draft_objective(spec):
        budgetdraft.check_budgets(drafting)


# corpus


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(corpus_mb: float, root: Path | None = None) -> Files:
    """(relative path, bytes) of the stdlib's .py files in sorted path order, up to corpus_mb."""
    root = root or stdlib_root()
    paths = sorted(
        (p.relative_to(root).as_posix(), p) for p in root.rglob("*.py")
        if p.is_file() and not EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1])
    )
    limit, total, files = int(corpus_mb * 1e6), 0, []
    for rel, path in paths:
        data = path.read_bytes()
        if total + len(data) > limit:
            break
        files.append((rel, data))
        total += len(data)
    if not files:
        raise DecodelabError(f"no standard-library sources found under {root} "
                             f"within corpus_mb={corpus_mb}")
    return files


def corpus_digest(files: Files) -> str:
    h = hashlib.sha256()
    for rel, data in files:
        h.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def path_hash(rel: str) -> int:
    return int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "little")


def split(files: Files) -> tuple[Files, Files]:
    """(train files, held-out files), by a hash of the path, not the content, so that a file
    stays on its side when its text changes between Python versions. A corpus too small to
    have a held-out file by that rule holds out the file of smallest hash."""
    if len(files) < 2:
        raise DecodelabError(f"a corpus of {len(files)} file(s) cannot be split into train and "
                             "held-out files; raise corpus_mb")
    held = {rel for rel, _ in files if path_hash(rel) % HELDOUT_EVERY == 0}
    held = held or {min((rel for rel, _ in files), key=path_hash)}
    return ([f for f in files if f[0] not in held], [f for f in files if f[0] in held])


def texts(files: Files) -> list[str]:
    return [data.decode("utf-8", errors="replace") for _, data in files]


# tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT)


def copy_tokenizer(src: Path, out: Path) -> None:
    """The teacher's tokenizer files, byte for byte, so draft and target share a vocabulary."""
    found = [name for name in TOKENIZER_FILES if (src / name).is_file()]
    if "tokenizer.json" not in found:
        raise DecodelabError(f"teacher {str(src)!r} has no tokenizer.json "
                             "(a draft can only distill from a `train` model)")
    for name in found:
        shutil.copyfile(src / name, out / name)


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    return [enc.ids for enc in tokenizer.backend_tokenizer.encode_batch(texts)]


def token_stream(docs: list[list[int]], eot: int) -> torch.Tensor:
    """Documents joined by end-of-text, one long tensor of token ids."""
    ids = [t for doc in docs for t in (*doc, eot)]
    return torch.tensor(ids, dtype=torch.long)


# model


def gpt2_config(spec: dict, vocab_size: int, eot: int):
    from transformers import GPT2Config

    # No dropout by default: a few hundred steps are far from overfitting, and dropout only
    # slows them. A GPU target sees the 2M-token corpus many times over and needs it.
    p = spec.get("dropout", 0.0)
    return GPT2Config(
        vocab_size=vocab_size, n_positions=spec["n_positions"], n_embd=spec["n_embd"],
        n_layer=spec["n_layer"], n_head=spec["n_head"], bos_token_id=eot, eos_token_id=eot,
        resid_pdrop=p, embd_pdrop=p, attn_pdrop=p,
    )


def llama_config(spec: dict, vocab_size: int, eot: int):
    from transformers import LlamaConfig

    # RoPE has no position table: n_positions only bounds the sequences the DAG asks for. An
    # FFN of 8/3 n_embd (SwiGLU's three matrices) matches GPT-2's 4 n_embd MLP in parameters.
    return LlamaConfig(
        vocab_size=vocab_size, max_position_embeddings=spec["n_positions"],
        hidden_size=spec["n_embd"], intermediate_size=8 * spec["n_embd"] // 3,
        num_hidden_layers=spec["n_layer"], num_attention_heads=spec["n_head"],
        bos_token_id=eot, eos_token_id=eot, tie_word_embeddings=True,
    )


MODEL_CONFIGS = {"gpt2": gpt2_config, "llama": llama_config}


def batch(data: torch.Tensor, seq_len: int, batch_size: int,
          gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - seq_len - 1, (batch_size,), generator=gen)
    x = torch.stack([data[i:i + seq_len] for i in ix.tolist()])
    y = torch.stack([data[i + 1:i + 1 + seq_len] for i in ix.tolist()])
    return x, y


def lr_at(step: int, steps: int, lr: float) -> float:
    """Linear warmup over the first 10% of steps, then cosine decay to 10% of lr."""
    warmup = max(1, steps // 10)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def logits_of(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, use_cache=False).logits


def loss_fn(logits: torch.Tensor, y: torch.Tensor, teacher_logits: torch.Tensor | None,
            distill: float) -> torch.Tensor:
    """Next-token cross-entropy, mixed with KL(teacher || student) when there is a teacher."""
    vocab = logits.size(-1)
    ce = F.cross_entropy(logits.view(-1, vocab), y.view(-1))
    if teacher_logits is None or distill == 0:
        return ce
    log_q = F.log_softmax(logits.view(-1, vocab), dim=-1)
    log_p = F.log_softmax(teacher_logits.view(-1, vocab), dim=-1)
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    return (1 - distill) * ce + distill * kl


def objective(spec: dict) -> str:
    """What the recorded train losses measure (held-out losses are always cross-entropy)."""
    if drafting := draft_objective(spec):
        return budgetdraft.describe(drafting)
    d = float(spec.get("distill", 0.0)) if "teacher" in spec else 0.0
    if d == 0:
        return "cross-entropy"
    return f"{1 - d:g} * cross-entropy + {d:g} * KL(teacher || model)"


def train(model: torch.nn.Module, data: torch.Tensor, spec: dict,
          teacher: torch.nn.Module | None = None, label: str = "train model",
          heldout: torch.Tensor | None = None, curve: list | None = None) -> list[float]:
    """AdamW on random windows; returns the loss of every step. A NaN/inf loss stops it (the
    loss is read back every step anyway), naming `label` and the step. With `eval_every` in
    the spec, (step, held-out loss) pairs of the `heldout` windows go into `curve`: where a
    model starts to overfit."""
    gen = torch.Generator().manual_seed(spec["seed"])
    opt = optimizer(model, spec["lr"])
    distill = float(spec.get("distill", 0.0))
    drafting = draft_objective(spec)
    device = next(model.parameters()).device
    model.train()
    losses = []
    bar = tqdm(range(spec["steps"]), desc="train", file=sys.stderr, mininterval=2.0)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec["steps"], spec["lr"])
        x, y = (t.to(device) for t in batch(data, spec["seq_len"], spec["batch_size"], gen))
        if drafting is not None:
            loss = budgetdraft.loss(model, teacher, x, drafting, gen)
        else:
            teacher_logits = None
            if teacher is not None and distill > 0:
                with torch.no_grad():
                    teacher_logits = logits_of(teacher, x)
            loss = loss_fn(logits_of(model, x), y, teacher_logits, distill)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            raise DecodelabError(
                f"{label}: training loss is {losses[-1]} (non-finite, NaN/inf) at step "
                f"{step + 1} of {spec['steps']}; nothing was saved. Lower 'lr' (now "
                f"{spec['lr']:g})" + (", or check the teacher" if teacher is not None else ""))
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        if curve is not None and (step + 1) % spec.get("eval_every", spec["steps"] + 1) == 0:
            model.eval()
            curve.append((step + 1, heldout_loss(model, heldout)))
            model.train()
    model.eval()
    return losses


# evaluation


def eval_windows(heldout: torch.Tensor, n_positions: int) -> torch.Tensor:
    """The fixed held-out sample: evenly spaced windows, no randomness, the same for any model
    that shares the tokenizer, so target and draft losses compare."""
    length = min(EVAL_LEN, n_positions, len(heldout) - 1)
    starts = torch.linspace(0, len(heldout) - length - 1, EVAL_WINDOWS).long().unique()
    return torch.stack([heldout[s:s + length + 1] for s in starts.tolist()])


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, windows: torch.Tensor) -> float:
    total = 0.0
    for w in windows.to(next(model.parameters()).device).split(16):
        logits = logits_of(model, w[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
    return total / windows[:, 1:].numel()


@torch.no_grad()
def acceptance(target: torch.nn.Module, draft: torch.nn.Module,
               windows: torch.Tensor) -> tuple[float, float]:
    """(beta, greedy agreement) at temperature 1 over the held-out positions.

    beta = E[sum_x min(p(x), q(x))] is the probability that speculative sampling accepts one
    drafted token (K = 1); greedy agreement is how often the two argmaxes are equal.
    """
    overlap, agree, count = 0.0, 0, 0
    for w in windows.to(next(target.parameters()).device).split(16):
        p = torch.softmax(logits_of(target, w[:, :-1]).double(), dim=-1)
        q = torch.softmax(logits_of(draft, w[:, :-1]).double(), dim=-1)
        overlap += torch.minimum(p, q).sum(-1).sum().item()
        agree += (p.argmax(-1) == q.argmax(-1)).sum().item()
        count += p.shape[0] * p.shape[1]
    return overlap / count, agree / count


# the source


def load_teacher(teacher_dir: Path, device: str) -> torch.nn.Module:
    return load(teacher_dir, device, "float32", role="teacher")


def init_from_teacher(model: torch.nn.Module, teacher: torch.nn.Module) -> int:
    """Start a shallow draft from its teacher's first layers (LayerSkip's early exit): every
    weight whose name and shape the two share, so the embeddings, the output head, the final
    norm and blocks 0..n_layer-1. A one-layer draft then begins as the target's early exit and
    distillation only has to close that gap (the aim: higher agreement at the same draft cost).
    Returns how many tensors were copied."""
    heads = (m.config.num_attention_heads for m in (model, teacher))
    if len(set(heads)) > 1:
        raise DecodelabError("train model spec: key 'init' is 'teacher', so 'n_head' must be "
                             f"the teacher's ({teacher.config.num_attention_heads}): a copied "
                             "block splits its attention into the teacher's heads")
    theirs = teacher.state_dict()
    mine = model.state_dict()
    shared = {k: v for k, v in theirs.items() if k in mine and mine[k].shape == v.shape}
    if not any("embed" in k or "wte" in k for k in shared):
        raise DecodelabError("train model spec: key 'init' is 'teacher' but the teacher's "
                             "embeddings do not fit this model (n_embd and vocab_size must "
                             "match the teacher's)")
    model.load_state_dict(shared, strict=False)
    return len(shared)


def training_device(spec: dict) -> str:
    device = spec.get("device", "cpu")
    if problem := backend_problem(device):
        raise DecodelabError(f"train model spec: key 'device' is {device!r}, which is not "
                             f"available here ({problem})")
    if device == "cuda":
        claim_gpu()
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matmuls: minutes, not tens of minutes
    return device


def prepare_train(out: Path, spec: dict, label: str, teacher_dir: Path | None) -> None:
    """Train a GPT-2 or Llama LM (and its tokenizer, unless a teacher lends its own) into `out`;
    `label` names it in errors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    validate(spec, teacher_dir)
    device = training_device(spec)
    start = time.perf_counter()
    files = corpus_files(spec["corpus_mb"])
    train_files, held_files = split(files)
    train_texts, held_texts = texts(train_files), texts(held_files)

    teacher = None
    if teacher_dir is not None:
        copy_tokenizer(teacher_dir, out)
        tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=False)
        # A small corpus can leave a tokenizer short of its vocab_size: compare specs.
        vocab = read_manifest(teacher_dir).get("spec", {}).get("vocab_size", len(tokenizer))
        if vocab != spec["vocab_size"]:
            raise DecodelabError(f"train model spec: key 'vocab_size' ({spec['vocab_size']}) "
                                 f"differs from the teacher's ({vocab})")
        teacher = load_teacher(teacher_dir, device)
    else:
        tokenizer = train_tokenizer(train_texts, spec["vocab_size"])
        tokenizer.save_pretrained(out)
    eot = tokenizer.convert_tokens_to_ids(EOT)
    data = token_stream(encode(tokenizer, train_texts), eot)
    heldout = token_stream(encode(tokenizer, held_texts), eot)

    torch.manual_seed(spec["seed"])
    arch = spec.get("arch", "gpt2")
    config = MODEL_CONFIGS[arch](spec, len(tokenizer), tokenizer.convert_tokens_to_ids(EOT))
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=False).to(device)
    copied = init_from_teacher(model, teacher) if spec.get("init") == "teacher" else 0
    train_start = time.perf_counter()
    windows = eval_windows(heldout, spec["n_positions"])
    curve = []
    losses = train(model, data, spec, teacher, label, windows, curve)
    train_seconds = time.perf_counter() - train_start

    info = dict(
        source="train", spec=spec, family=arch, parameters=count_parameters(model),
        python=platform.python_version(), torch=torch.__version__,
        threads=torch.get_num_threads(), device=device, device_name=device_name(device),
        corpus=dict(root=str(stdlib_root()), sha256=corpus_digest(files), files=len(files),
                    bytes=sum(len(d) for _, d in files), train_files=len(train_texts),
                    heldout_files=len(held_texts), train_tokens=len(data),
                    heldout_tokens=len(heldout)),
        objective=objective(spec), init=spec.get("init", "random"), init_copied=copied,
        initial_train_loss=losses[0],
        final_train_loss=sum(losses[-10:]) / len(losses[-10:]),
        heldout_loss=heldout_loss(model, windows), heldout_curve=curve,
        heldout_sample=dict(windows=len(windows), tokens=int(windows[:, 1:].numel())),
        train_seconds=round(train_seconds, 2),
    )
    if drafting := draft_objective(spec):
        info["draft_objective"] = asdict(drafting)
    if teacher is not None:
        beta, greedy = acceptance(teacher, model, windows)
        info |= dict(teacher=spec["teacher"], teacher_heldout_loss=heldout_loss(teacher, windows),
                     teacher_corpus_sha256=read_manifest(teacher_dir).get("corpus", {})
                     .get("sha256"), beta=beta, greedy_agreement=greedy)
    model.save_pretrained(out, safe_serialization=True)
    info["wall_seconds"] = round(time.perf_counter() - start, 2)
    write_manifest(out, **info)


PROMPT_CORPUS_MB = 8.0  # held-out files for a model that was not trained here


def heldout_prompts(model_dir: str | Path, n: int, length: int, seed: int) -> list[list[int]]:
    """n prompts of `length` token ids, drawn deterministically by seed.

    A `train` model's come from its own held-out files (the split re-derived with the corpus
    rules); a pretrained model with a tokenizer encodes the held-out files of this standard
    library; an `init` model, which has neither tokenizer nor meaningful predictions, gets
    seeded random ids in its vocabulary. A prompt lies inside one file, so it never straddles
    an end-of-text.
    """
    from transformers import AutoConfig, AutoTokenizer

    manifest = read_manifest(model_dir)
    gen = torch.Generator().manual_seed(seed)
    if not (Path(model_dir) / "tokenizer_config.json").is_file():
        vocab = AutoConfig.from_pretrained(model_dir, trust_remote_code=False).vocab_size
        return torch.randint(vocab, (n, length), generator=gen).tolist()
    if manifest.get("source") == "train":
        files = corpus_files(manifest["spec"]["corpus_mb"])
        if corpus_digest(files) != manifest["corpus"]["sha256"]:
            import warnings

            warnings.warn(f"the standard library here (Python {platform.python_version()}) is "
                          f"not the corpus {model_dir} was trained on (Python "
                          f"{manifest['python']}); prompts come from the held-out files of this "
                          "one", stacklevel=2)
    else:
        files = corpus_files(PROMPT_CORPUS_MB)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    docs = [d for d in encode(tokenizer, texts(split(files)[1])) if len(d) >= length]
    if not docs:
        raise DecodelabError(f"no held-out file has {length} tokens; ask for shorter prompts")
    prompts = []
    for _ in range(n):
        doc = docs[int(torch.randint(len(docs), (1,), generator=gen))]
        start = int(torch.randint(len(doc) - length + 1, (1,), generator=gen))
        prompts.append(doc[start:start + length])
    return prompts
