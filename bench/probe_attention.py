"""The metadata of the CUDA attention kernels' results.

Sizes, strides, dtype and device of what flash, memory-efficient and cuDNN
attention return, forward and backward, for query [B, H, L, E] and key and
value [B, H, S, E] in the heads-major and the sequence-major layouts, with
and without dropout: what Note [Attention kernels' metadata] in
ir/src/meta_functions.cpp reproduces. Also which kernel
scaled_dot_product_attention picks. Needs a CUDA GPU and PyTorch:

    python3 bench/probe_attention.py
"""

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten
B, H, L, S, E = 2, 4, 96, 80, 64


def describe(x):
    if isinstance(x, torch.Tensor):
        return f"T{tuple(x.shape)}s{x.stride()}o{x.storage_offset()} {x.dtype} {x.device}"
    return repr(x)


def show(name, results):
    print(name, "->", " | ".join(describe(x) for x in results))


def inputs(dtype, layout):
    def one(n):
        if layout == "bhle":
            return torch.randn(B, H, n, E, device="cuda", dtype=dtype, requires_grad=True)
        t = torch.randn(B, n, H, E, device="cuda", dtype=dtype).transpose(1, 2)
        return t.detach().requires_grad_()

    return one(L), one(S), one(S)


def probe(dtype, layout, p):
    tag = f"{dtype} {layout} p={p}"
    q, k, v = inputs(dtype, layout)
    g = make_fx(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=p))(q, k, v)
    print(tag, "sdpa picks", [str(n.target) for n in g.graph.nodes if "attention" in str(n.target)])
    if dtype != torch.float32:  # flash and cuDNN take half precision only
        r = aten._scaled_dot_product_flash_attention(q, k, v, p, False, False)
        show(tag + " flash", r)
        grad = torch.randn_like(r[0])
        show(tag + " flash_bwd", aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, r[0], r[1], r[2], r[3], r[4], r[5], p, False, r[6], r[7]))
        r = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, p, False, False)
        show(tag + " cudnn", r)
        show(tag + " cudnn_bwd", aten._scaled_dot_product_cudnn_attention_backward(
            grad, q, k, v, r[0], r[1], r[6], r[7], None, r[2], r[3], r[4], r[5], p, False))
    for lse in (True, False):
        show(tag + f" efficient lse={lse}", aten._scaled_dot_product_efficient_attention(q, k, v, None, lse, p, False))
    r = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, p, False)
    show(tag + " efficient_bwd", aten._scaled_dot_product_efficient_attention_backward(
        torch.randn_like(r[0]), q, k, v, None, r[0], r[1], r[2], r[3], p, [True, True, True, False], False))
    bias = torch.randn(B, H, L, S, device="cuda", dtype=dtype, requires_grad=True)
    r = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, p, False)
    show(tag + " efficient+bias", r)
    show(tag + " efficient_bwd+bias", aten._scaled_dot_product_efficient_attention_backward(
        torch.randn_like(r[0]), q, k, v, bias, r[0], r[1], r[2], r[3], p, [True, True, True, True], False))


for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for layout in ("bhle", "blhe"):
        for p in (0.0, 0.1):
            probe(dtype, layout, p)
