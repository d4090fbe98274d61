#!/usr/bin/env python3
"""Writes tests/model/data/hf/: tiny random Hugging Face models of several
architectures (config.json + model.safetensors) and their logits, computed by
transformers' own PyTorch implementations (attn_implementation="eager", float32,
eval mode), as a reference independent of kestrel.

    python3 -m venv /tmp/hfenv
    /tmp/hfenv/bin/pip install torch transformers safetensors numpy
    /tmp/hfenv/bin/python tools/gen_hf_reference.py [-o tests/model/data/hf]

Every model: hidden 64, 2 layers, 4 heads (head_dim 16), intermediate 128,
vocab 256, max positions 128, weights N(0, 0.15^2) from a fixed seed, every
norm weight 1 + 0.1*N(0,1) (and every norm / linear bias present 0.05*N(0,1))
so that norms and biases are exercised. See tests/model/data/hf/README.md for
what each model needs on the C++ side.

Outputs per model directory: config.json, model.safetensors (or shards +
model.safetensors.index.json), logits.json = {"transformers", "torch",
"sequences": [{"tokens", "logits": [[vocab floats] per position],
"max_abs_logit"}], "max_abs_logit", "logit_std"}; logits rounded to 6
significant digits. llama3, qwen2, phi3 and gpt2 get their config.json
rewritten to the transformers-4.x form (top-level rope_theta / rope_scaling /
torch_dtype), the others keep the 5.x form; both reload to the same logits.
At the end a float64 numpy re-implementation of the README's formulas
(numpy_check) is compared with every logits.json.
"""
import argparse
import json
import math
import os
import shutil

import numpy as np
import torch
from safetensors.torch import load_file as load_torch
import transformers
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HIDDEN, LAYERS, HEADS, INTER, VOCAB, MAXPOS = 64, 2, 4, 128, 256, 128
INIT_STD = 0.15

SEQUENCES = [
    [17],
    [1, 200, 33, 7, 150, 99, 255],
    [(i * 37 + 11) % VOCAB for i in range(20)],
]

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=INTER,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    max_position_embeddings=MAXPOS,
    initializer_range=INIT_STD,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)


def llama_config(**kw):
    c = dict(COMMON, num_key_value_heads=2, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    c.update(kw)
    return LlamaConfig(**c)


def llama3_config(**kw):
    c = dict(COMMON, num_key_value_heads=2, tie_word_embeddings=True,
             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                              "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 64})
    c.update(kw)
    return LlamaConfig(**c)


def mistral_config(**kw):
    c = dict(COMMON, num_key_value_heads=2, tie_word_embeddings=False,
             sliding_window=8,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    c.update(kw)
    return MistralConfig(**c)


def qwen2_config(**kw):
    c = dict(COMMON, num_key_value_heads=2, tie_word_embeddings=True,
             use_sliding_window=False, max_window_layers=LAYERS,
             rms_norm_eps=1e-6,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    c.update(kw)
    return Qwen2Config(**c)


def phi3_config(**kw):
    c = dict(COMMON, num_key_value_heads=4, tie_word_embeddings=False,
             original_max_position_embeddings=MAXPOS,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                              "partial_rotary_factor": 1.0})
    c.update(kw)
    return Phi3Config(**c)


def gpt2_config(**kw):
    c = dict(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
             n_positions=MAXPOS, n_inner=INTER,
             # published GPT-2 configs carry n_ctx (== n_positions) too, and
             # llama.cpp's converter reads that key
             n_ctx=MAXPOS, activation_function="gelu_new",
             layer_norm_epsilon=1e-5, initializer_range=INIT_STD,
             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
             tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    c.update(kw)
    return GPT2Config(**c)


# configs rewritten to the transformers-4.x form (see to_legacy_config); the
# others keep the 5.x form ("rope_parameters") that save_pretrained writes
LEGACY_CONFIG = {
    "llama3": {},
    # as in published Qwen2 configs: a window size is present but switched off
    "qwen2": {"sliding_window": 4096},
    "phi3": {},
    "gpt2": {},
}

ARCHS = {
    # name: (config factory, model class, seed)
    "llama": (llama_config, LlamaForCausalLM, 1001),
    "llama3": (llama3_config, LlamaForCausalLM, 1002),
    "mistral": (mistral_config, MistralForCausalLM, 1003),
    "qwen2": (qwen2_config, Qwen2ForCausalLM, 1004),
    "gpt2": (gpt2_config, GPT2LMHeadModel, 1005),
    "phi3": (phi3_config, Phi3ForCausalLM, 1006),
}


def build(name, **config_overrides):
    """The model for `name`, with every weight drawn from the arch's seed."""
    make_config, cls, seed = ARCHS[name]
    config = make_config(**config_overrides)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32)
    model.config._attn_implementation = "eager"
    # Redraw every parameter from our own generator, in a fixed order, so the
    # weights do not depend on transformers' init code (which changes between
    # versions). Tied parameters are one tensor and are drawn once.
    gen = torch.Generator().manual_seed(seed)
    seen = set()
    with torch.no_grad():
        for pname, p in model.named_parameters(remove_duplicate=True):
            if id(p) in seen:
                continue
            seen.add(id(p))
            is_norm = any(k in pname for k in ("norm", "ln_"))
            if is_norm and pname.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif pname.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(INIT_STD * torch.randn(p.shape, generator=gen))
    model.eval()
    return model


def run(model, tokens):
    with torch.no_grad():
        ids = torch.tensor([tokens], dtype=torch.long)
        out = model(input_ids=ids, use_cache=False)
    return out.logits[0].to(torch.float32)


def r6(x):
    return float(f"{x:.6g}")


def logits_doc(model, note=None):
    seqs = []
    allv = []
    for toks in SEQUENCES:
        lg = run(model, toks)
        allv.append(lg.flatten())
        seqs.append({
            "tokens": toks,
            "max_abs_logit": r6(lg.abs().max().item()),
            "logits": [[r6(v) for v in row] for row in lg.tolist()],
        })
    allv = torch.cat(allv)
    doc = {
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "compute": "float32, eager attention, one batch row, no padding, positions 0..n-1",
        "max_abs_logit": r6(allv.abs().max().item()),
        # mean over all positions of the std over the vocabulary
        "logit_std": r6(torch.cat([run(model, t) for t in SEQUENCES]).std(dim=-1).mean().item()),
    }
    if note:
        doc["note"] = note
    doc["sequences"] = seqs
    return doc


def write_json(path, doc):
    # one position's logits per line: diffable and still small
    with open(path, "w") as f:
        f.write("{\n")
        keys = [k for k in doc if k != "sequences"]
        for k in keys:
            f.write(f"  {json.dumps(k)}: {json.dumps(doc[k])},\n")
        f.write('  "sequences": [\n')
        for si, s in enumerate(doc["sequences"]):
            f.write("    {\n")
            f.write(f'      "tokens": {json.dumps(s["tokens"])},\n')
            f.write(f'      "max_abs_logit": {json.dumps(s["max_abs_logit"])},\n')
            f.write('      "logits": [\n')
            rows = s["logits"]
            for ri, row in enumerate(rows):
                f.write("        " + json.dumps(row, separators=(",", ":")))
                f.write(",\n" if ri + 1 < len(rows) else "\n")
            f.write("      ]\n")
            f.write("    }" + (",\n" if si + 1 < len(doc["sequences"]) else "\n"))
        f.write("  ]\n}\n")


def save(model, outdir, **kw):
    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    model.save_pretrained(outdir, safe_serialization=True, **kw)
    gc = os.path.join(outdir, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)


def to_legacy_config(outdir, **extra):
    """Rewrites outdir/config.json in the form transformers 4.x wrote (and most
    published checkpoints have): top-level "rope_theta", "rope_scaling" (null
    or a dict with "rope_type"), "torch_dtype"; no "rope_parameters". The
    caller reloads it with this transformers to check it means the same."""
    path = os.path.join(outdir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    if "rope_parameters" not in cfg:  # gpt2: learned positions, no rope
        cfg["torch_dtype"] = cfg.pop("dtype")
        cfg.update(extra)
        with open(path, "w") as f:
            json.dump(dict(sorted(cfg.items())), f, indent=2)
            f.write("\n")
        return
    rp = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rp.pop("rope_theta")
    rp.pop("partial_rotary_factor", None)
    cfg["rope_scaling"] = None if rp.get("rope_type", "default") == "default" else rp
    cfg["torch_dtype"] = cfg.pop("dtype")
    cfg.pop("layer_types", None)
    cfg.update(extra)
    with open(path, "w") as f:
        json.dump(dict(sorted(cfg.items())), f, indent=2)
        f.write("\n")


def max_diff(a, b):
    return (a - b).abs().max().item()


def check_reload(outdir, cls, model, dtype=torch.float32):
    """The saved files reload into the same logits (catches tie/shard mistakes)."""
    m2 = cls.from_pretrained(outdir, attn_implementation="eager", dtype=dtype).to(torch.float32).eval()
    sd1, sd2 = model.state_dict(), m2.state_dict()
    assert sd1.keys() == sd2.keys(), (outdir, set(sd1) ^ set(sd2))
    for k in sd1:
        assert torch.equal(sd1[k].to(torch.float32), sd2[k]), (outdir, k)
    for t in SEQUENCES:
        # same weights; memory layout may change the GEMM's summation order
        d = max_diff(run(model, t), run(m2, t))
        assert d < 1e-5, (outdir, d)


# ---------------------------------------------------------------------------
# An independent re-implementation, in float64 numpy, of the formulas that
# tests/model/data/hf/README.md states; main() checks it against logits.json,
# so the README is checked too. Reads only the files written above.
H = None

def load(m):
    with open(os.path.join(H, m, "config.json")) as f:
        cfg = json.load(f)
    files = ["model.safetensors"]
    index = os.path.join(H, m, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    w = {}
    for fn in files:  # torch loader: numpy has no bfloat16
        for k, v in load_torch(os.path.join(H, m, fn)).items():
            w[k] = v.to(torch.float32).numpy()
    return cfg, w

def rms(x, g, eps): return g * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))
def ln(x, g, b, eps):
    mu = x.mean(-1, keepdims=True); var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b
def silu(z): return z / (1 + np.exp(-z))
def gelu_new(z): return 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))

def rope_params(cfg):
    rp = cfg.get("rope_parameters")
    if rp is None:
        rp = dict(cfg.get("rope_scaling") or {})
        rp.setdefault("rope_type", rp.get("type", "default"))
        rp["rope_theta"] = cfg.get("rope_theta", 10000.0)
    return rp

def inv_freq(cfg, d):
    rp = rope_params(cfg)
    base = rp["rope_theta"]
    f = np.array([base ** (-(2 * i) / d) for i in range(d // 2)], dtype=np.float64)
    if rp["rope_type"] == "llama3":
        old = rp["original_max_position_embeddings"]; fac = rp["factor"]
        lo, hi = rp["low_freq_factor"], rp["high_freq_factor"]
        out = []
        for x in f:
            wl = 2 * math.pi / x
            if wl < old / hi: out.append(x)
            elif wl > old / lo: out.append(x / fac)
            else:
                s = (old / wl - lo) / (hi - lo); out.append((1 - s) * x / fac + s * x)
        f = np.array(out)
    return f

def rope_neox(v, pos, f):  # v [n, heads, d]
    d = v.shape[-1]; th = pos[:, None] * f[None, :]  # [n, d/2]
    c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
    a, b = v[..., : d // 2], v[..., d // 2 :]
    return np.concatenate([a * c - b * s, b * c + a * s], -1)

def attend(q, k, v, window=None):  # q [n, H, d], k/v [n, KV, d]
    n, Hh, d = q.shape; KV = k.shape[1]; rep = Hh // KV
    out = np.zeros_like(q)
    for h in range(Hh):
        kh = h // rep
        sc = q[:, h, :] @ k[:, kh, :].T / math.sqrt(d)
        for i in range(n):
            for j in range(n):
                if j > i or (window is not None and not (j > i - window)): sc[i, j] = -np.inf
        p = np.exp(sc - sc.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
        out[:, h, :] = p @ v[:, kh, :]
    return out.reshape(n, Hh * d)

def llama_like(m, toks):
    cfg, w = load(m)
    E = cfg["hidden_size"]; Hh = cfg["num_attention_heads"]; KV = cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or E // Hh; eps = cfg["rms_norm_eps"]
    # mistral: sliding_window applies to every layer; qwen2: only if
    # use_sliding_window (false here); phi3 / llama: none here
    window = cfg.get("sliding_window") if cfg["model_type"] == "mistral" else None
    if cfg["model_type"] == "qwen2":
        assert not cfg.get("use_sliding_window")
    if cfg["model_type"] == "phi3":
        assert cfg.get("sliding_window") is None
    f = inv_freq(cfg, d); pos = np.arange(len(toks), dtype=np.float64)
    x = w["model.embed_tokens.weight"][toks].astype(np.float64)
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        hN = rms(x, w[p + "input_layernorm.weight"], eps)
        if cfg["model_type"] == "phi3":
            qkv = hN @ w[p + "self_attn.qkv_proj.weight"].T
            q, k, v = qkv[:, :Hh * d], qkv[:, Hh * d:(Hh + KV) * d], qkv[:, (Hh + KV) * d:]
        else:
            q = hN @ w[p + "self_attn.q_proj.weight"].T; k = hN @ w[p + "self_attn.k_proj.weight"].T; v = hN @ w[p + "self_attn.v_proj.weight"].T
            if p + "self_attn.q_proj.bias" in w:
                q = q + w[p + "self_attn.q_proj.bias"]; k = k + w[p + "self_attn.k_proj.bias"]; v = v + w[p + "self_attn.v_proj.bias"]
        n = len(toks)
        q = rope_neox(q.reshape(n, Hh, d), pos, f); k = rope_neox(k.reshape(n, KV, d), pos, f)
        a = attend(q, k, v.reshape(n, KV, d), window)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        hN = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        if cfg["model_type"] == "phi3":
            gu = hN @ w[p + "mlp.gate_up_proj.weight"].T; I = gu.shape[-1] // 2
            g, u = gu[:, :I], gu[:, I:]
        else:
            g = hN @ w[p + "mlp.gate_proj.weight"].T; u = hN @ w[p + "mlp.up_proj.weight"].T
        x = x + (silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"], eps)
    W = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    assert ("lm_head.weight" in w) == (not cfg["tie_word_embeddings"])
    return x @ W.T

def gpt2(m, toks):
    cfg, w = load(m)
    E = cfg["n_embd"]; Hh = cfg["n_head"]; d = E // Hh; eps = cfg["layer_norm_epsilon"]; n = len(toks)
    P = "transformer."
    x = w[P + "wte.weight"][toks].astype(np.float64) + w[P + "wpe.weight"][:n]
    for L in range(cfg["n_layer"]):
        p = f"{P}h.{L}."
        hN = ln(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = hN @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = qkv[:, :E], qkv[:, E:2 * E], qkv[:, 2 * E:]
        a = attend(q.reshape(n, Hh, d), k.reshape(n, Hh, d), v.reshape(n, Hh, d))
        x = x + a @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        hN = ln(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        x = x + gelu_new(hN @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]) @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = ln(x, w[P + "ln_f.weight"], w[P + "ln_f.bias"], eps)
    return x @ w[P + "wte.weight"].T


def numpy_check(out):
    global H
    H = out
    res = {}
    for m in ["llama", "llama-sharded", "llama-bf16", "llama3", "mistral", "qwen2", "phi3", "gpt2", "gpt2-f16"]:
        with open(os.path.join(H, m, "logits.json")) as f:
            ref = json.load(f)
        worst = 0.0
        for sq in ref["sequences"]:
            got = (gpt2 if m.startswith("gpt2") else llama_like)(m, sq["tokens"])
            worst = max(worst, float(np.abs(got - np.array(sq["logits"])).max()))
        res[m] = worst
        assert worst < 1e-4, (m, worst)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", default=os.path.join(ROOT, "tests", "model", "data", "hf"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    checks = {}

    for name in ARCHS:
        model = build(name)
        outdir = os.path.join(args.out, name)
        save(model, outdir)
        if name in LEGACY_CONFIG:
            to_legacy_config(outdir, **LEGACY_CONFIG[name])
        check_reload(outdir, ARCHS[name][1], model)
        note = None
        long_seq = SEQUENCES[-1]
        if name == "llama3":
            plain = build(name, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
            d = max_diff(run(model, long_seq), run(plain, long_seq))
            checks["llama3: max |logit diff| vs no llama3 scaling (20 tokens)"] = d
            assert d > 1e-3, d
        if name == "mistral":
            full = build(name, sliding_window=None)
            a, b = run(model, long_seq), run(full, long_seq)
            d_early = max_diff(a[:8], b[:8])
            d19 = max_diff(a[19], b[19])
            checks["mistral: max |logit diff| vs sliding_window=None, positions 0..7"] = d_early
            checks["mistral: max |logit diff| vs sliding_window=None, position 19"] = d19
            assert d_early < 1e-5 and d19 > 1e-3, (d_early, d19)
            note = ("sliding_window=8 is applied: query at position q attends to keys k with "
                    "q-8 < k <= q (both layers)")
        if name == "qwen2":
            nz = all(p.abs().min().item() > 0 for n, p in model.named_parameters() if n.endswith("bias"))
            assert nz
        doc = logits_doc(model, note)
        checks[f"{name}: logit_std"] = doc["logit_std"]
        assert doc["logit_std"] > 0.5, (name, doc["logit_std"])
        write_json(os.path.join(outdir, "logits.json"), doc)

        if name == "llama":
            sh = os.path.join(args.out, "llama-sharded")
            save(model, sh, max_shard_size="100KB")
            assert os.path.exists(os.path.join(sh, "model.safetensors.index.json"))
            check_reload(sh, LlamaForCausalLM, model)
            shutil.copy(os.path.join(outdir, "logits.json"), os.path.join(sh, "logits.json"))

            bf = os.path.join(args.out, "llama-bf16")
            mb = build(name).to(torch.bfloat16)
            save(mb, bf)
            # reference: the bf16 weights, upcast exactly to f32, computed in f32
            mf = LlamaForCausalLM.from_pretrained(bf, attn_implementation="eager",
                                                  dtype=torch.bfloat16).to(torch.float32).eval()
            bdoc = logits_doc(mf, "weights stored as bfloat16 (round-to-nearest-even from the "
                                  "llama model's f32 weights); logits computed with those bf16 "
                                  "values upcast exactly to float32, all arithmetic in float32")
            d = max_diff(run(mf, long_seq), run(model, long_seq))
            checks["llama-bf16: max |logit diff| vs f32 llama (20 tokens)"] = d
            write_json(os.path.join(bf, "logits.json"), bdoc)

        if name == "gpt2":
            # float16 storage, through the transposed Conv1D path: the f16
            # weights upcast exactly to f32, all arithmetic in f32.
            hf = os.path.join(args.out, "gpt2-f16")
            save(build(name).to(torch.float16), hf)
            if name in LEGACY_CONFIG:
                to_legacy_config(hf, **LEGACY_CONFIG[name])
            mf = GPT2LMHeadModel.from_pretrained(hf, attn_implementation="eager",
                                                 dtype=torch.float16).to(torch.float32).eval()
            hdoc = logits_doc(mf, "weights stored as float16 (round-to-nearest-even from the gpt2 "
                                  "model's f32 weights); logits computed with those f16 values "
                                  "upcast exactly to float32, all arithmetic in float32")
            checks["gpt2-f16: max |logit diff| vs f32 gpt2 (20 tokens)"] = max_diff(run(mf, long_seq), run(model, long_seq))
            write_json(os.path.join(hf, "logits.json"), hdoc)

    for m, d in numpy_check(args.out).items():
        checks[f"{m}: max |float64 numpy re-implementation - logits.json|"] = d
    for k, v in checks.items():
        print(f"{k}: {v:.6g}")


if __name__ == "__main__":
    main()
