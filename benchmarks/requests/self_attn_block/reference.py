import torch.nn.functional as F


def forward(x, w_qkv, w_o, heads: int = 2):
    b, s, e = x.shape
    q, k, v = F.linear(x, w_qkv).chunk(3, dim=-1)
    q, k, v = (t.view(b, s, heads, e // heads).transpose(1, 2) for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(o.transpose(1, 2).reshape(b, s, e), w_o)
