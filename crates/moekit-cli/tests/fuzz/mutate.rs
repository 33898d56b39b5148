//! The fuzz test's seeded, deterministic mutator: a SplitMix64 PRNG and
//! structure-aware mutations of GGUF files, safetensors files, JSON files
//! (`config.json`, `model.safetensors.index.json`) and `.npy` arrays, plus
//! plain byte-level ones (truncation, flips, inserted / deleted / overwritten
//! bytes). Every mutation returns a one-line description for the report.

use serde_json::{json, Value};

/// SplitMix64: small, fast, and the same sequence on every platform.
pub struct Rng(u64);

impl Rng {
    /// The generator of case `iter` of a run seeded with `seed` (cases are
    /// independent, so a failing one replays alone).
    pub fn for_case(seed: u64, iter: u64) -> Rng {
        let mut r = Rng(seed ^ iter.wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.next();
        r
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; 0 for `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    /// True with probability `pct` / 100.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

/// A value to write into an integer field that held `old`: the boundaries a
/// parser must survive (0, 2^32 − 1, u64::MAX, ...) or a near miss of `old`.
pub fn special(r: &mut Rng, old: u64) -> u64 {
    match r.below(16) {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => u32::MAX as u64,
        4 => 1 << 32,
        5 => i64::MAX as u64,
        6 => 1 << 63,
        7 => i32::MAX as u64 + 1,
        8 => old.wrapping_add(1),
        9 => old.wrapping_sub(1),
        10 => old.wrapping_mul(2),
        11 => old / 2,
        12 => old << 32,
        13 => 1 << r.below(64),
        14 => old.wrapping_add(1 + r.below(64) as u64),
        _ => r.next(),
    }
}

/// Plain byte-level mutations, biased towards the first 4 KiB (the headers).
pub fn bytes(r: &mut Rng, b: &mut Vec<u8>) -> String {
    let len = b.len();
    let pos = |r: &mut Rng| {
        if r.chance(70) {
            r.below(len.min(4096))
        } else {
            r.below(len)
        }
    };
    if len == 0 {
        b.push(r.next() as u8);
        return "grew an empty file to 1 byte".into();
    }
    match r.below(6) {
        0 => {
            let at = pos(r);
            b.truncate(at);
            format!("truncated to {at} bytes")
        }
        1 => {
            let n = 1 + r.below(8);
            let mut at = Vec::new();
            for _ in 0..n {
                let p = pos(r);
                b[p] ^= 1 << r.below(8);
                at.push(p);
            }
            format!("flipped a bit at bytes {at:?}")
        }
        2 => {
            let p = pos(r);
            let v = r.next() as u8;
            b[p] = v;
            format!("byte {p} := {v:#04x}")
        }
        3 => {
            let p = pos(r).min(len.saturating_sub(8));
            let v = special(r, 0);
            let n = 8.min(len - p);
            b[p..p + n].copy_from_slice(&v.to_le_bytes()[..n]);
            format!("bytes {p}..{} := {v:#x} (le)", p + n)
        }
        4 => {
            let p = pos(r);
            let n = 1 + r.below(16);
            let v: Vec<u8> = (0..n).map(|_| r.next() as u8).collect();
            b.splice(p..p, v);
            format!("inserted {n} random bytes at {p}")
        }
        _ => {
            let p = pos(r);
            let n = (1 + r.below(16)).min(len - p);
            b.drain(p..p + n);
            format!("deleted {n} bytes at {p}")
        }
    }
}

/// An integer field of a binary header: where it is, how wide, what it is.
pub struct Field {
    pub pos: usize,
    pub width: usize,
    pub what: String,
}

/// A float to write into an `f32` / `f64` metadata value.
fn special_float(r: &mut Rng) -> f64 {
    *r.pick(&[
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -1.0,
        1e38,
        -1e-45,
        f64::MAX,
    ])
}

/// Overwrites a random one of `fields` with a [`special`] value.
pub fn field(r: &mut Rng, b: &mut [u8], fields: &[Field], kind: &str) -> Option<String> {
    if fields.is_empty() {
        return None;
    }
    let f = r.pick(fields);
    let slot = b.get_mut(f.pos..f.pos + f.width)?;
    if f.what.starts_with("float ") {
        let v = special_float(r);
        match f.width {
            4 => slot.copy_from_slice(&(v as f32).to_le_bytes()),
            _ => slot.copy_from_slice(&v.to_le_bytes()),
        }
        return Some(format!("{kind} {} at byte {} := {v}", f.what, f.pos));
    }
    if let Some(rest) = f.what.strip_prefix("dims ") {
        // Swap two dimensions of a tensor (same element count).
        let n = f.width / 8;
        let (i, j) = (r.below(n), r.below(n));
        let (a, c) = (f.pos + 8 * i, f.pos + 8 * j);
        for k in 0..8 {
            b.swap(a + k, c + k);
        }
        return Some(format!("{kind} swapped ne[{i}] and ne[{j}] of {rest}"));
    }
    let mut old = [0u8; 8];
    old[..f.width].copy_from_slice(slot);
    let v = if f.what.starts_with("ggml type") && r.chance(70) {
        // Another real type: sizes and block shapes no longer match.
        *r.pick(&[0u64, 1, 2, 3, 6, 7, 8, 10, 12, 14, 16, 24, 30, 39])
    } else {
        special(r, u64::from_le_bytes(old))
    };
    slot.copy_from_slice(&v.to_le_bytes()[..f.width]);
    let shown = if f.width == 4 { v as u32 as u64 } else { v };
    Some(format!(
        "{kind} field {} at byte {} (u{}) := {shown}",
        f.what,
        f.pos,
        f.width * 8
    ))
}

/// The integer fields of a GGUF file's header, metadata and tensor infos
/// (counts, lengths, types, scalar values, dimensions, offsets); stops at the
/// first thing it cannot parse.
pub fn gguf_fields(b: &[u8]) -> Vec<Field> {
    let mut out = Vec::new();
    let mut c = Cursor { b, pos: 8 };
    let f = |out: &mut Vec<Field>, pos, width, what: String| out.push(Field { pos, width, what });
    let (Some(nt), Some(nkv)) = (c.u64_at(8), c.u64_at(16)) else {
        return out;
    };
    f(&mut out, 4, 4, "version".into());
    f(&mut out, 8, 8, "tensor count".into());
    f(&mut out, 16, 8, "metadata count".into());
    c.pos = 24;
    for _ in 0..nkv.min(10_000) {
        let Some(key) = c.string(&mut out, "key length") else {
            return out;
        };
        let tpos = c.pos;
        let Some(ty) = c.u32() else { return out };
        f(&mut out, tpos, 4, format!("type of `{key}`"));
        if c.value(&mut out, ty, &key, 0).is_none() {
            return out;
        }
    }
    for _ in 0..nt.min(10_000) {
        let Some(name) = c.string(&mut out, "tensor name length") else {
            return out;
        };
        let npos = c.pos;
        let Some(nd) = c.u32() else { return out };
        f(&mut out, npos, 4, format!("n_dims of `{name}`"));
        if (2..=4).contains(&nd) {
            f(
                &mut out,
                c.pos,
                8 * nd as usize,
                format!("dims of `{name}`"),
            );
        }
        for d in 0..nd.min(8) {
            f(&mut out, c.pos, 8, format!("ne[{d}] of `{name}`"));
            c.u64();
        }
        f(&mut out, c.pos, 4, format!("ggml type of `{name}`"));
        c.u32();
        f(&mut out, c.pos, 8, format!("data offset of `{name}`"));
        if c.u64().is_none() {
            return out;
        }
    }
    out.retain(|x| x.pos + x.width <= b.len());
    out
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn u64_at(&self, at: usize) -> Option<u64> {
        Some(u64::from_le_bytes(self.b.get(at..at + 8)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        let v = self.u64_at(self.pos)?;
        self.pos += 8;
        Some(v)
    }
    fn u32(&mut self) -> Option<u32> {
        let v = u32::from_le_bytes(self.b.get(self.pos..self.pos + 4)?.try_into().ok()?);
        self.pos += 4;
        Some(v)
    }
    fn string(&mut self, out: &mut Vec<Field>, what: &str) -> Option<String> {
        let at = self.pos;
        let n = usize::try_from(self.u64()?).ok()?;
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        let s = String::from_utf8_lossy(s).into_owned();
        out.push(Field {
            pos: at,
            width: 8,
            what: format!("{what} of `{s}`"),
        });
        Some(s)
    }
    fn value(&mut self, out: &mut Vec<Field>, ty: u32, key: &str, depth: usize) -> Option<()> {
        let scalar = |w: usize| Some(w);
        let width = match ty {
            0 | 1 | 7 => scalar(1),
            2 | 3 => scalar(2),
            4..=6 => scalar(4),
            10..=12 => scalar(8),
            _ => None,
        };
        if let Some(w) = width {
            let what = match ty {
                4 | 5 | 10 | 11 => Some(format!("value of `{key}`")),
                6 | 12 => Some(format!("float value of `{key}`")),
                _ => None,
            };
            if let Some(what) = what {
                out.push(Field {
                    pos: self.pos,
                    width: w,
                    what,
                });
            }
            self.pos += w;
            return (self.pos <= self.b.len()).then_some(());
        }
        match ty {
            8 => self.string(out, &format!("string in `{key}`")).map(|_| ()),
            9 if depth < 4 => {
                let tpos = self.pos;
                let ety = self.u32()?;
                let cpos = self.pos;
                let n = self.u64()?;
                out.push(Field {
                    pos: tpos,
                    width: 4,
                    what: format!("element type of `{key}`"),
                });
                out.push(Field {
                    pos: cpos,
                    width: 8,
                    what: format!("array length of `{key}`"),
                });
                let before = out.len();
                for _ in 0..n.min(100_000) {
                    self.value(out, ety, key, depth + 1)?;
                }
                // Long arrays (a tokenizer's vocabulary) would drown the rest.
                if out.len() - before > 16 {
                    out.truncate(before + 16);
                }
                Some(())
            }
            _ => None,
        }
    }
}

/// Special JSON values for a config or header entry.
fn json_special(r: &mut Rng, old: &Value) -> (Value, String) {
    let v = match r.below(18) {
        0 => Value::Null,
        1 => json!(-1),
        2 => json!(0),
        3 => json!(1),
        4 => json!(u64::MAX),
        5 => json!(u32::MAX),
        6 => json!(1e30),
        7 => json!(-1e300),
        8 => json!(2.5),
        9 => json!("x"),
        10 => json!(true),
        11 => json!([]),
        12 => json!({}),
        13 => json!(i64::MIN),
        14 => match old.as_u64() {
            Some(n) => json!(n.wrapping_add(1)),
            None => json!(7),
        },
        15 => match old.as_u64() {
            Some(n) => json!(n.saturating_sub(1)),
            None => json!(""),
        },
        16 => match old.as_u64() {
            Some(n) => json!(n.saturating_mul(1 << 20)),
            None => json!([1, 2]),
        },
        _ => json!(1u64 << r.below(64)),
    };
    let s = v.to_string();
    (v, s)
}

/// Every path (object keys / array indices) in `v`, depth first.
fn paths(v: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                prefix.push(k.clone());
                out.push(prefix.clone());
                paths(x, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate().take(8) {
                prefix.push(i.to_string());
                out.push(prefix.clone());
                paths(x, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, k| match v {
        Value::Object(m) => m.get_mut(k),
        Value::Array(a) => a.get_mut(k.parse::<usize>().ok()?),
        _ => None,
    })
}

/// Edits one entry of a JSON document: a wrong type, a huge, negative or
/// off-by-one number, a deleted key, or a key renamed.
pub fn json_value(r: &mut Rng, doc: &mut Value, what: &str) -> String {
    let mut all = Vec::new();
    paths(doc, &mut Vec::new(), &mut all);
    if all.is_empty() {
        *doc = json!([]);
        return format!("{what}: replaced by []");
    }
    let path = r.pick(&all).clone();
    let (last, parent) = match path.split_last() {
        Some((l, p)) => (l.clone(), p.to_vec()),
        None => return format!("{what}: unchanged"),
    };
    let shown = path.join(".");
    let Some(parent) = at_mut(doc, &parent) else {
        return format!("{what}: unchanged");
    };
    match (r.below(5), parent) {
        (0, Value::Object(m)) => {
            m.remove(&last);
            format!("{what}: removed `{shown}`")
        }
        (1, Value::Object(m)) => {
            if let Some(v) = m.remove(&last) {
                m.insert(format!("{last}_"), v);
            }
            format!("{what}: renamed `{shown}` to `{last}_`")
        }
        (_, p) => {
            let Some(slot) = at_mut(p, std::slice::from_ref(&last)) else {
                return format!("{what}: unchanged");
            };
            let (v, s) = json_special(r, slot);
            *slot = v;
            format!("{what}: `{shown}` := {s}")
        }
    }
}

/// Mutates a `.safetensors` file: its 8-byte header length, or one entry of
/// its JSON header (dtype, a shape dim, data offsets, a name), rewriting the
/// header and keeping the data section.
pub fn safetensors(r: &mut Rng, b: &mut Vec<u8>) -> Option<String> {
    let n = u64::from_le_bytes(b.get(..8)?.try_into().ok()?) as usize;
    let header: Value = serde_json::from_slice(b.get(8..8usize.checked_add(n)?)?).ok()?;
    let data = b.get(8 + n..)?.to_vec();
    if r.chance(20) {
        let v = special(r, n as u64);
        b[..8].copy_from_slice(&v.to_le_bytes());
        return Some(format!("safetensors header length := {v}"));
    }
    let mut h = header;
    let names: Vec<String> = h
        .as_object()?
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    let name = r.pick(&names).clone();
    let obj = h.as_object_mut()?;
    let what = match r.below(6) {
        0 => {
            let t = obj.get_mut(&name)?;
            let d = *r.pick(&[
                "F32", "F16", "BF16", "U8", "U32", "I64", "F64", "BOOL", "Q4",
            ]);
            t["dtype"] = json!(d);
            format!("`{name}`.dtype := {d}")
        }
        1 => {
            let t = obj.get_mut(&name)?;
            let shape = t.get_mut("shape")?.as_array_mut()?;
            let what = match r.below(4) {
                0 if !shape.is_empty() => {
                    let i = r.below(shape.len());
                    let old = shape[i].as_u64().unwrap_or(0);
                    let v = special(r, old);
                    shape[i] = json!(v);
                    format!("`{name}`.shape[{i}] := {v}")
                }
                1 => {
                    shape.push(json!(1 + r.below(3)));
                    format!("`{name}`.shape gained a dim")
                }
                2 => {
                    shape.pop();
                    format!("`{name}`.shape lost a dim")
                }
                _ => {
                    shape.reverse();
                    format!("`{name}`.shape reversed")
                }
            };
            what
        }
        2 => {
            let t = obj.get_mut(&name)?;
            let offs = t.get_mut("data_offsets")?.as_array_mut()?;
            let i = r.below(2.min(offs.len()));
            let old = offs.get(i)?.as_u64().unwrap_or(0);
            let v = special(r, old);
            offs[i] = json!(v);
            format!("`{name}`.data_offsets[{i}] := {v}")
        }
        3 => {
            obj.remove(&name);
            format!("removed tensor `{name}`")
        }
        4 => {
            let other = r.pick(&names).clone();
            let t = obj.remove(&name)?;
            obj.insert(other.clone(), t);
            format!("tensor `{name}` renamed to `{other}`")
        }
        _ => json_value(r, &mut h, "safetensors header"),
    };
    let text = serde_json::to_vec(&h).ok()?;
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&data);
    *b = out;
    Some(what)
}

/// Mutates an `.npy` file's header: its length field, version, dtype, order
/// or shape (huge, zero, missing or extra dimensions).
pub fn npy(r: &mut Rng, b: &mut Vec<u8>) -> Option<String> {
    if b.len() < 10 {
        return None;
    }
    match r.below(4) {
        0 => {
            let v = special(r, u16::from_le_bytes([b[8], b[9]]) as u64) as u16;
            b[8..10].copy_from_slice(&v.to_le_bytes());
            Some(format!("npy header length := {v}"))
        }
        1 => {
            let v = *r.pick(&[0u8, 2, 3, 4, 255]);
            b[6] = v;
            Some(format!("npy version := {v}"))
        }
        _ => {
            let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
            let header = std::str::from_utf8(b.get(10..10 + hlen)?).ok()?.to_string();
            let shapes = [
                "(4, 18446744073709551615)".to_string(),
                "(18446744073709551615, 18446744073709551615)".into(),
                "(4294967295, 64)".into(),
                "(0, 64)".into(),
                "(4, 0)".into(),
                "()".into(),
                "(256,)".into(),
                "(2, 2, 64)".into(),
                "(-4, 64)".into(),
                "(4, 64".into(),
                format!("({}, 256)", special(r, 4)),
                format!("(4, {})", special(r, 256)),
            ];
            let (from, to, what) = match r.below(3) {
                0 => {
                    let s = header.find("'shape'")?;
                    let e = s + header[s..].find(')')? + 1;
                    let new = format!("'shape': {}", r.pick(&shapes));
                    (s, e, new)
                }
                1 => {
                    let s = header.find("'descr'")?;
                    let e = s + header[s..].find(',')?;
                    let d = r.pick(&["'<f8'", "'>f4'", "'<i4'", "'<u2'", "'|b1'", "'<f4"]);
                    (s, e, format!("'descr': {d}"))
                }
                _ => {
                    let s = header.find("'fortran_order'")?;
                    let e = s + header[s..].find(',')?;
                    let o = r.pick(&["True", "1", "None"]);
                    (s, e, format!("'fortran_order': {o}"))
                }
            };
            let mut h = header.clone();
            h.replace_range(from..to, &what);
            let mut out = b[..8].to_vec();
            out.extend_from_slice(&(h.len() as u16).to_le_bytes());
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(&b[10 + hlen..]);
            *b = out;
            Some(format!("npy header: {what}"))
        }
    }
}
