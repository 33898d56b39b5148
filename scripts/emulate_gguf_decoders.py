#!/usr/bin/env python3
"""Host emulation of the fast GGUF tile decoders of
crates/moekit/kernels/tc_decode_gguf.cuh (Q8_0, Q4_0; bf16 and f16), without
a GPU: a line-by-line transcription of the CUDA (PRMT = __byte_perm, funnel
shifts, the f32 FFMA, which is exact here and asserted to be, f16 HADD2/HFMA2
with one IEEE rounding, the bf16/f16 packs) checked bit for bit against the
generic decoder's arithmetic (TcDecCodes: fmaf(q, d, 0) in f32, rounded once
to T), on random and edge-case blocks at both block alignments (b = 0 and
2 mod 4), slices of no columns (exact zeros), and that the loads read only
the block's bytes; then exhaustively, for every finite f16 d and every code,
that the magic-number forms are exact. Keep it in step with the CUDA source.

Usage: pip install numpy && python3 scripts/emulate_gguf_decoders.py
(about 20 s)."""
import numpy as np, random, struct
from fractions import Fraction

def prmt(x, y, s):  # __byte_perm: result byte n = byte (s >> 4n) & 7 of y:x
    b = (x | (y << 32)).to_bytes(8, 'little')
    return int.from_bytes(bytes(b[(s >> (4 * n)) & 7] for n in range(4)), 'little')

def funnel_r(lo, hi, sh):  # __funnelshift_r: (hi:lo) >> (sh & 31), low 32 bits
    return (((hi << 32) | lo) >> (sh & 31)) & 0xFFFFFFFF

def f32(bits): return struct.unpack('<f', struct.pack('<I', bits))[0]
def f32bits(v): return struct.unpack('<I', struct.pack('<f', v))[0]
def h2f(bits): return float(np.frombuffer(struct.pack('<H', bits), np.float16)[0])
def f2hbits(v):  # RN-even to f16 from an exact double (inf past the range)
    with np.errstate(over='ignore'):
        return struct.unpack('<H', np.float16(v).tobytes())[0]
def f2bf16bits(v):  # RN-even to bf16 from an f32 value (finite)
    b = f32bits(v); return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF

def exact_f32(x):  # x (Fraction) must be exactly an f32; returns the float
    v = float(x); assert Fraction(v) == x and Fraction(np.float32(v).item()) == x, x; return v

def ffma_exact(a, b, c):  # __fmaf_rn where a·b + c is exact in f32 (asserted)
    return exact_f32(Fraction(a) * Fraction(b) + Fraction(c))

def fmul_exact(a, b): return exact_f32(Fraction(a) * Fraction(b))

def pair(lo_bits, hi_bits): return lo_bits | (hi_bits << 16)
def halves(v): return v & 0xFFFF, v >> 16

def hadd2(a, b):  # exact cases only (asserted)
    r = []
    for x, y in zip(halves(a), halves(b)):
        s = Fraction(h2f(x)) + Fraction(h2f(y)); bits = f2hbits(float(s))
        assert Fraction(h2f(bits)) == s; r.append(bits)
    return pair(*r)

def hfma2(a, b, c):  # one rounding of the exact a·b + c (c = +0 here)
    r = []
    for x, y, z in zip(halves(a), halves(b), halves(c)):
        e = Fraction(h2f(x)) * Fraction(h2f(y)) + Fraction(h2f(z))
        if e == 0: r.append(0x0000)  # x·y = ±0, + (+0) = +0 in RN
        else: r.append(f2hbits(float(e)))  # e has ≤ 22 bits: exact in double
    return pair(*r)

def pack(T, lo, hi):
    if T == 'bf16': return pair(f2bf16bits(lo), f2bf16bits(hi))
    return pair(f2hbits(lo), f2hbits(hi))

# ---- the decoders, mirroring the CUDA source ----
class Block32:
    def __init__(self, mem, b, n, ok):
        self.reads = set()
        def ld(addr, size, align):
            assert addr % align == 0
            self.reads.update(range(addr, addr + size))
            return int.from_bytes(mem[addr:addr + size], 'little')
        odd = b & 2
        self.w = [ld(b + odd + 4 * i, 4, 4) for i in range(n // 4)] + [ld(b + n, 2, 2)]
        self.db = ld(b, 2, 2) if ok else 0
        self.sh = 16 - 8 * odd
    def word(self, i): return funnel_r(self.w[i], self.w[i + 1], self.sh)

def q8_four(T, blk, x):
    x ^= 0x80808080
    if T == 'f16':
        d2 = (blk.db * 0x10001) & 0xFFFFFFFF
        lo = hfma2(hadd2(prmt(x, 0x64646464, 0x4140), 0xE480E480), d2, 0)
        hi = hfma2(hadd2(prmt(x, 0x64646464, 0x4342), 0xE480E480), d2, 0)
        return lo, hi
    d = h2f(blk.db); c = fmul_exact(d, -32896.0)
    v = [ffma_exact(f32(prmt(x, 0x47000000, 0x7404 | (k << 4))), d, c) for k in range(4)]
    return pack(T, v[0], v[1]), pack(T, v[2], v[3])

def q8_unit(T, blk, u):
    a = q8_four(T, blk, blk.word(2 * u)); b = q8_four(T, blk, blk.word(2 * u + 1))
    return [a[0], a[1], b[0], b[1]]

def q4_four(T, blk, x, high):
    m = x & (0xF0F0F0F0 if high else 0x0F0F0F0F)
    if T == 'f16':
        magic = 0x54545454 if high else 0x64646464
        neg = 0xD480D480 if high else 0xE408E408
        d2 = (blk.db * 0x10001) & 0xFFFFFFFF
        return (hfma2(hadd2(prmt(m, magic, 0x4140), neg), d2, 0), hfma2(hadd2(prmt(m, magic, 0x4342), neg), d2, 0))
    n = ((x >> 4) & 0x0F0F0F0F) if high else m
    d = h2f(blk.db); c = fmul_exact(d, -32776.0)
    v = [ffma_exact(f32(prmt(n, 0x47000000, 0x7404 | (k << 4))), d, c) for k in range(4)]
    return pack(T, v[0], v[1]), pack(T, v[2], v[3])

def q4_unit(T, blk, u):
    w = 2 * (u & 1); high = u >= 2
    a = q4_four(T, blk, blk.word(w), high); b = q4_four(T, blk, blk.word(w + 1), high)
    return [a[0], a[1], b[0], b[1]]

# ---- reference: the generic decoder (F::codes, fmaf(q, d, 0), one rounding) ----
def ref_weights(fmt, blockbytes):
    d = h2f(blockbytes[0] | (blockbytes[1] << 8))
    if fmt == 'q8_0': qs = [struct.unpack('b', bytes([x]))[0] for x in blockbytes[2:34]]
    else: qs = [(x & 15) - 8 for x in blockbytes[2:18]] + [(x >> 4) - 8 for x in blockbytes[2:18]]
    out = []
    for q in qs:
        p = Fraction(q) * Fraction(d)
        v = exact_f32(p) if p != 0 else 0.0  # fmaf(q, d, +0): +0 for a zero product
        out.append(v)
    return out

def ref_units(fmt, T, blockbytes):
    w = ref_weights(fmt, blockbytes)
    return [[pack(T, w[8 * u + 2 * i], w[8 * u + 2 * i + 1]) for i in range(4)] for u in range(4)]

def check(fmt, T, blockbytes, b_off, ok=True):
    size = 34 if fmt == 'q8_0' else 18
    mem = bytearray(random.getrandbits(8) for _ in range(b_off + size + 8))
    mem[b_off:b_off + size] = blockbytes
    blk = Block32(mem, b_off, 32 if fmt == 'q8_0' else 16, ok)
    assert blk.reads <= set(range(b_off, b_off + size)), 'read outside the block'
    unit = q8_unit if fmt == 'q8_0' else q4_unit
    got = [unit(T, blk, u) for u in range(4)]
    want = ref_units(fmt, T, blockbytes) if ok else [[0] * 4] * 4
    assert got == want, (fmt, T, b_off, blockbytes.hex(), got, want)

random.seed(1)
finite_d = [h for h in range(0x10000) if (h & 0x7C00) != 0x7C00]
specials = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x1234, 0x5A5A]
n = 0
for fmt in ('q8_0', 'q4_0'):
    size = 34 if fmt == 'q8_0' else 18
    for T in ('bf16', 'f16'):
        for trial in range(1500):
            dh = random.choice(specials) if trial < 200 else random.choice(finite_d)
            codes = bytes(random.getrandbits(8) for _ in range(size - 2))
            if trial % 7 == 0: codes = bytes(range(size - 2))  # every small code
            blockbytes = bytes([dh & 0xFF, dh >> 8]) + codes
            for b_off in (16, 18, 20, 22):  # b ≡ 0 and ≡ 2 (mod 4)
                check(fmt, T, blockbytes, b_off, ok=True); n += 1
            check(fmt, T, blockbytes, 18, ok=False); check(fmt, T, blockbytes, 16, ok=False); n += 2
print('block checks passed:', n)

# Exhaustive numerics of one code against every finite d (vectorized, f64 exact):
# bf16 path F·d + c == q·d exactly and c exact in f32; f16 path: HADD2 results exact.
d = np.array([h2f(h) for h in finite_d], dtype=np.float64)
for name, K, codes in (('q8_0', 32896.0, [(u, u - 128, 0x47000000 | (u << 8)) for u in range(256)]),
                       ('q4_0', 32776.0, [(n_, n_ - 8, 0x47000000 | (n_ << 8)) for n_ in range(16)])):
    c = (-K * d).astype(np.float32).astype(np.float64)
    assert np.all(c == -K * d), name + ': c not exact in f32'
    for u, q, Fbits in codes:
        F = f32(Fbits); assert F == 2 ** 15 + u
        v = F * d + c  # exact in f64 (≤ 17 + 11 bits, same scale)
        assert np.all(v == q * d), name
        assert np.all(v.astype(np.float32).astype(np.float64) == v), name + ': q·d not exact in f32'
# f16 magic: 1024 + u − 1152 = q (Q8_0), 1024 + n − 1032, 64 + n − 72 = n − 8 (Q4_0): exact in f16
for u in range(256): assert np.float16(1024 + u) - np.float16(1152) == u - 128
for n_ in range(16):
    assert np.float16(1024 + n_) - np.float16(1032) == n_ - 8 and np.float16(64 + n_) - np.float16(72) == n_ - 8
    assert h2f(0x5400 | (16 * n_)) == 64 + n_ and h2f(0x6400 | n_) == 1024 + n_
print('exhaustive code x d numerics passed')
