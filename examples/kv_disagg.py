"""Disaggregated serving: prefill and decode in two processes, the KV cache moved between them
by Monel's transfer engine.

A small decoder-only transformer (torch, weights from a fixed seed) serves a batch of prompts:

  1. the decode process owns a paged KV cache (a torch tensor of blocks, each holding every
     layer's keys and values for 16 tokens) and registers it in place as a segment; for
     each request it allocates blocks and sends the prompt and the block numbers to the
     prefill process as a notification;
  2. the prefill process computes the prompt's keys and values, stages them in blocks of
     the same layout, WRITEs the blocks straight into the decode process's cache, and the
     batch's notification (the first token) follows once the blocks are in place;
  3. the decode process reads the keys and values from its cache and generates.

The decode process also runs every request in one process (prefill and decode on local
memory) and checks that the generated tokens are exactly equal. It prints each request's
time to first token, split into prefill compute and KV transfer, and the transfer's GB/s.

    python examples/kv_disagg.py                                  # both, two processes, one host
    python examples/kv_disagg.py --transport rdma                 # shm (default here), rdma, tcp
    python examples/kv_disagg.py --role decode --ip 10.0.0.2      # on one host (or netns)
    python examples/kv_disagg.py --role prefill --ip 10.0.0.1 --peer 10.0.0.2
    python examples/kv_disagg.py --etcd 10.0.0.9:2379 ...         # meet by name through etcd

Both roles need the same MONEL_SECRET (the job secret the agents prove to each other).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from monel import xfer

BLOCK_TOKENS = 16
PORT = 18750


class Model(torch.nn.Module):
    """A GPT-style decoder: pre-norm blocks, causal attention with a KV cache, greedy."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, max_len: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(max_len, dim)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                {
                    "ln1": torch.nn.LayerNorm(dim),
                    "qkv": torch.nn.Linear(dim, 3 * dim),
                    "out": torch.nn.Linear(dim, dim),
                    "ln2": torch.nn.LayerNorm(dim),
                    "up": torch.nn.Linear(dim, 4 * dim),
                    "down": torch.nn.Linear(4 * dim, dim),
                }
            )
            for _ in range(layers)
        )
        self.ln = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, start: int, past: list | None):
        """Runs `tokens` (positions start..) over the cached keys and values `past` (one
        (K, V) of [T, heads, head_dim] per layer, or None); returns the last position's
        logits and each layer's (K, V) for every position so far."""
        n = tokens.shape[0]
        x = self.embed(tokens) + self.pos(torch.arange(start, start + n))
        kv = []
        for i, b in enumerate(self.blocks):
            q, k, v = b["qkv"](b["ln1"](x)).view(n, 3, self.heads, self.head_dim).unbind(1)
            if past is not None:
                k = torch.cat([past[i][0], k])
                v = torch.cat([past[i][1], v])
            kv.append((k, v))
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.head_dim)
            # Causal: position start+j sees keys 0..start+j.
            mask = torch.arange(k.shape[0])[None, :] > torch.arange(start, start + n)[:, None]
            att = scores.masked_fill(mask, float("-inf")).softmax(-1)
            x = x + b["out"](torch.einsum("hqk,khd->qhd", att, v).reshape(n, -1))
            x = x + b["down"](F.gelu(b["up"](b["ln2"](x))))
        return self.head(self.ln(x[-1])), kv


def build(args) -> Model:
    torch.manual_seed(args.seed)
    m = Model(args.vocab, args.dim, args.layers, args.heads, args.max_len)
    return m.eval()


def prompts(args) -> list[list[int]]:
    g = torch.Generator().manual_seed(args.seed + 1)
    lens = torch.randint(args.min_prompt, args.max_prompt + 1, (args.requests,), generator=g)
    return [torch.randint(0, args.vocab, (int(n),), generator=g).tolist() for n in lens]


def generate(model: Model, kv: list, first: int, start: int, steps: int) -> list[int]:
    """Greedy decoding from the prompt's cache `kv` and its first token."""
    out, tok, past = [first], first, kv
    for i in range(steps - 1):
        logits, past = model(torch.tensor([tok]), start + i, past)
        tok = int(logits.argmax())
        out.append(tok)
    return out


def cache_shape(args, blocks: int) -> tuple:
    return (blocks, args.layers, 2, BLOCK_TOKENS, args.heads, args.dim // args.heads)


def to_blocks(kv: list, dst: torch.Tensor, first_block: int) -> int:
    """Copies a prompt's (K, V) per layer into consecutive blocks of `dst` from
    `first_block`; returns how many blocks it took."""
    n = kv[0][0].shape[0]
    nb = -(-n // BLOCK_TOKENS)
    for layer, (k, v) in enumerate(kv):
        for j in range(nb):
            lo, hi = j * BLOCK_TOKENS, min(n, (j + 1) * BLOCK_TOKENS)
            dst[first_block + j, layer, 0, : hi - lo] = k[lo:hi]
            dst[first_block + j, layer, 1, : hi - lo] = v[lo:hi]
    return nb


def from_blocks(cache: torch.Tensor, blocks: list[int], n: int) -> list:
    """A prompt's (K, V) per layer, `n` tokens, read from `blocks` of the cache."""
    sel = cache[blocks]  # [nb, layers, 2, BT, H, D]
    layers = sel.shape[1]
    flat = sel.permute(1, 2, 0, 3, 4, 5).reshape(layers, 2, -1, *sel.shape[-2:])
    return [(flat[i, 0, :n].clone(), flat[i, 1, :n].clone()) for i in range(layers)]


def setup_torch() -> None:
    # One thread and no autograd in both processes, so both compute alike.
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)


def run_decode(args, secret: str) -> int:
    setup_torch()
    model = build(args)
    reqs = prompts(args)
    per_req = -(-args.max_prompt // BLOCK_TOKENS)
    cache = torch.zeros(cache_shape(args, per_req * args.requests))
    block_bytes = cache[0].numel() * cache.element_size()
    agent = xfer.Agent("decode", args.ip, listen=f"{args.ip}:{args.port}", secret=secret,
                       udp_port=args.udp_port, transport=args.transport, etcd=args.etcd,
                       job="kv-disagg")
    agent.register("kv", cache)
    print(f"# decode: KV cache of {cache.shape[0]} blocks x {block_bytes >> 10} KiB "
          f"registered at {agent.address}", flush=True)
    end = time.monotonic() + 60
    while "prefill" not in agent.peers():
        if time.monotonic() > end:
            sys.exit("decode: no prefill process connected within 60 s")
        time.sleep(0.01)
    # One request at a time (each TTFT unqueued): its prompt and the blocks allocated for
    # it go to the prefill process; its first token comes back after its blocks.
    sent, done, summary = {}, {}, None
    for r, toks in enumerate(reqs):
        blocks = list(range(r * per_req, r * per_req + -(-len(toks) // BLOCK_TOKENS)))
        sent[r] = (time.perf_counter(), blocks)
        msg = json.dumps({"id": r, "prompt": toks, "blocks": blocks}).encode()
        agent.transfer("prefill", [], notify=msg).wait()
        while r not in done:
            got = agent.wait_notifications(timeout=60)
            if not got:
                sys.exit(f"decode: request {r} not back after 60 s")
            for _, _, payload in got:
                m = json.loads(payload)
                if "summary" in m:
                    summary = m["summary"]
                else:
                    done[m["id"]] = (time.perf_counter(), m)
    while summary is None:
        got = agent.wait_notifications(timeout=60)
        if not got:
            sys.exit("decode: the prefill side's summary did not come")
        summary = json.loads(got[-1][2])["summary"]
    ok, ttfts, computes = 0, [], []
    for r, toks in enumerate(reqs):
        (t0, blocks), (t1, m) = sent[r], done[r]
        kv = from_blocks(cache, blocks, len(toks))
        got = generate(model, kv, m["first"], len(toks), args.new_tokens)
        # The same request in one process, on local memory.
        logits, ref_kv = model(torch.tensor(toks), 0, None)
        ref = generate(model, ref_kv, int(logits.argmax()), len(toks), args.new_tokens)
        same = got == ref
        ok += same
        ttft = (t1 - t0) * 1e3
        ttfts.append(ttft)
        computes.append(m["compute_ms"])
        print(f"request {r}: prompt {len(toks):4d} tokens, {len(blocks):2d} blocks; "
              f"TTFT {ttft:7.2f} ms = prefill compute {m['compute_ms']:7.2f} ms + "
              f"KV transfer and hand-off {ttft - m['compute_ms']:6.2f} ms; "
              f"tokens {'equal' if same else 'DIFFER'}", flush=True)
        if not same:
            print(f"  disaggregated {got}\n  one process    {ref}")
    gbs = summary["bytes"] / summary["seconds"] / 1e9 if summary["seconds"] else 0.0
    print(f"# {ok}/{len(reqs)} requests generated exactly the single-process tokens; "
          f"median TTFT {sorted(ttfts)[len(ttfts) // 2]:.2f} ms "
          f"(prefill compute {sorted(computes)[len(computes) // 2]:.2f} ms); "
          f"KV transfer {summary['bytes'] / 1e6:.1f} MB at {gbs:.2f} GB/s over "
          f"{agent.transport('prefill')}", flush=True)
    return 0 if ok == len(reqs) else 1


def run_prefill(args, secret: str) -> int:
    setup_torch()
    model = build(args)
    per_req = -(-args.max_prompt // BLOCK_TOKENS)
    # Staging for every request in flight: request r's blocks go from r * per_req.
    staging = torch.zeros(cache_shape(args, per_req * args.requests))
    block_bytes = staging[0].numel() * staging.element_size()
    agent = xfer.Agent("prefill", args.ip, secret=secret, udp_port=args.udp_port,
                       transport=args.transport, etcd=args.etcd, job="kv-disagg")
    agent.register("staging", staging)
    if args.etcd:
        peer = agent.connect_name("decode", retry_for=30)
    else:
        peer = agent.connect(f"{args.peer}:{args.port}", retry_for=30)
    print(f"# prefill: connected to {peer} over {agent.transport(peer)}", flush=True)
    agent.wait_for_segment(peer, "kv")
    moved, busy, served = 0, 0.0, 0
    while served < args.requests:
        got = agent.wait_notifications(timeout=60)
        if not got:
            sys.exit(f"prefill: no request after 60 s of silence ({served} served)")
        for _, _, payload in got:
            m = json.loads(payload)
            r, toks, blocks = m["id"], m["prompt"], m["blocks"]
            t0 = time.perf_counter()
            logits, kv = model(torch.tensor(toks), 0, None)
            first = int(logits.argmax())
            local = r * per_req
            nb = to_blocks(kv, staging, local)
            compute_ms = (time.perf_counter() - t0) * 1e3
            assert nb == len(blocks), (nb, blocks)
            descs = [("write", "staging", (local + j) * block_bytes, "kv", b * block_bytes,
                      block_bytes) for j, b in enumerate(blocks)]
            note = json.dumps({"id": r, "first": first, "compute_ms": compute_ms}).encode()
            t1 = time.perf_counter()
            agent.transfer(peer, descs, notify=note).wait()
            busy += time.perf_counter() - t1
            moved += nb * block_bytes
            served += 1
    summary = {"summary": {"bytes": moved, "seconds": busy}}
    agent.transfer(peer, [], notify=json.dumps(summary).encode()).wait()
    # The summary reaches the decode side before this one leaves.
    agent.flush()
    print(f"# prefill: {served} requests, {moved / 1e6:.1f} MB of KV blocks written", flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=["both", "prefill", "decode"], default="both")
    p.add_argument("--ip", default=None, help="this side's address (its soft RNIC)")
    p.add_argument("--peer", default="127.0.0.1", help="the decode side's address (prefill)")
    p.add_argument("--port", type=int, default=PORT, help="the decode agent's TCP port")
    p.add_argument("--udp-port", type=int, default=4791,
                   help="the soft RNIC's UDP port (0: any, to share one address)")
    p.add_argument("--transport", choices=["auto", "shm", "rdma", "tcp"], default="auto",
                   help="the link between the two agents")
    p.add_argument("--etcd", default=None,
                   help="an etcd server (host:port): the agents meet by name through it")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--min-prompt", type=int, default=48)
    p.add_argument("--max-prompt", type=int, default=320)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    args.max_len = args.max_prompt + args.new_tokens
    if args.role == "both":
        secret = secrets.token_hex(16)
        env = dict(os.environ, MONEL_SECRET=secret)
        base = [sys.executable, __file__, "--udp-port", "0", "--requests", str(args.requests),
                "--min-prompt", str(args.min_prompt), "--max-prompt", str(args.max_prompt),
                "--new-tokens", str(args.new_tokens), "--vocab", str(args.vocab),
                "--dim", str(args.dim), "--layers", str(args.layers), "--heads",
                str(args.heads), "--seed", str(args.seed), "--port", str(args.port),
                "--transport", args.transport] + (["--etcd", args.etcd] if args.etcd else [])
        dec = subprocess.Popen(base + ["--role", "decode", "--ip", "127.0.0.1"], env=env)
        pre = subprocess.Popen(base + ["--role", "prefill", "--ip", "127.0.0.2",
                                       "--peer", "127.0.0.1"], env=env)
        rd, rp = dec.wait(timeout=600), pre.wait(timeout=600)
        return rd or rp
    secret = os.environ.get("MONEL_SECRET")
    if not secret:
        sys.exit("set MONEL_SECRET to the job's secret (the same on both sides)")
    if args.ip is None:
        sys.exit("--ip: this side's address")
    return run_decode(args, secret) if args.role == "decode" else run_prefill(args, secret)


if __name__ == "__main__":
    sys.exit(main())
