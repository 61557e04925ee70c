//! Value encoding: the encoded value columns of one change in one
//! allocation (`Vals`, borrowed as `ValsRef`): a LEB128 header, the ends
//! of the values, then their bytes. `Event` stores its values in this
//! layout, after its own header.

/// The encoded value columns of one change (`HistCodec`) in one allocation:
/// a header (LEB128 of `n << 1 | wide`, one byte below 64 columns), the end
/// offsets of the first `n - 1` values (u16 little-endian, u32 when `wide`;
/// the last ends with the bytes), then the bytes. One allocation per event
/// instead of one per value, and a few header bytes per event: a history
/// flow holds every event of every key, and both bound it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Vals(Box<[u8]>);

impl Vals {
    pub fn new<'a>(vals: impl Iterator<Item = &'a [u8]> + Clone) -> Vals {
        let shape = vals_shape(vals.clone());
        let mut out = Vec::with_capacity(vals_len(shape));
        push_vals(&mut out, vals, shape);
        Vals(out.into_boxed_slice())
    }

    /// A view of the values.
    pub fn as_ref(&self) -> ValsRef<'_> {
        ValsRef(&self.0)
    }

    pub fn len(&self) -> usize {
        self.as_ref().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value column `c`, encoded.
    pub fn get(&self, c: usize) -> &[u8] {
        self.as_ref().get(c)
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + Clone + '_ {
        self.as_ref().iter()
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.0.len()
    }
}

/// How `vals` lay out: (count, bytes of the values, header, offset width).
pub(super) fn vals_shape<'a>(vals: impl Iterator<Item = &'a [u8]>) -> (usize, usize, u64, usize) {
    let (n, bytes, last) = vals.fold((0usize, 0usize, 0usize), |(n, b, _), v| {
        (n + 1, b + v.len(), v.len())
    });
    // The last value's end is the end of the bytes: only the others' are kept.
    let wide = bytes - last > u16::MAX as usize;
    (
        n,
        bytes,
        ((n as u64) << 1) | wide as u64,
        if wide { 4 } else { 2 },
    )
}

/// The bytes `push_vals` writes for values of that shape.
pub(super) fn vals_len((n, bytes, h, w): (usize, usize, u64, usize)) -> usize {
    leb128_len(h) + w * n.saturating_sub(1) + bytes
}

/// Appends `vals` (of shape `shape`, `vals_shape`) in `Vals`' layout.
pub(super) fn push_vals<'a>(
    out: &mut Vec<u8>,
    vals: impl Iterator<Item = &'a [u8]> + Clone,
    (n, _, h, w): (usize, usize, u64, usize),
) {
    push_leb128(out, h);
    let mut end = 0usize;
    for v in vals.clone().take(n.saturating_sub(1)) {
        end += v.len();
        out.extend_from_slice(&end.to_le_bytes()[..w]);
    }
    for v in vals {
        out.extend_from_slice(v);
    }
}

pub(super) fn leb128_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

pub(super) fn push_leb128(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// (value, bytes read) of the LEB128 at the start of `b`.
#[inline]
pub(super) fn read_leb128(b: &[u8]) -> (u64, usize) {
    if b[0] < 0x80 {
        return (b[0] as u64, 1);
    }
    let (mut v, mut shift) = (0u64, 0);
    for (i, &x) in b.iter().enumerate() {
        v |= ((x & 0x7f) as u64) << shift;
        if x < 0x80 {
            return (v, i + 1);
        }
        shift += 7;
    }
    panic!("a truncated LEB128 in encoded values")
}

/// The encoded value columns of one change, borrowed (`Vals`' layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ValsRef<'a>(pub(super) &'a [u8]);

impl<'a> ValsRef<'a> {
    /// (columns, offset width, header bytes).
    #[inline]
    fn header(&self) -> (usize, usize, usize) {
        if self.0.is_empty() {
            return (0, 2, 0);
        }
        let (h, at) = read_leb128(self.0);
        ((h >> 1) as usize, if h & 1 == 1 { 4 } else { 2 }, at)
    }

    /// The end of value `i` (of the first `n - 1`) at offset width `w`
    /// after a header of `at` bytes.
    #[inline]
    fn end(&self, at: usize, w: usize, i: usize) -> usize {
        let o = at + w * i;
        if w == 2 {
            u16::from_le_bytes([self.0[o], self.0[o + 1]]) as usize
        } else {
            u32::from_le_bytes(self.0[o..o + 4].try_into().expect("4 bytes")) as usize
        }
    }

    pub fn len(&self) -> usize {
        self.header().0
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value column `c`, encoded.
    #[inline]
    pub fn get(&self, c: usize) -> &'a [u8] {
        let (n, w, at) = self.header();
        assert!(c < n, "value column {c} of {n}");
        let data = at + w * (n - 1);
        let start = if c == 0 { 0 } else { self.end(at, w, c - 1) };
        let end = if c == n - 1 {
            self.0.len() - data
        } else {
            self.end(at, w, c)
        };
        &self.0[data + start..data + end]
    }

    /// The values in order (the header read once).
    #[inline]
    pub fn iter(self) -> impl Iterator<Item = &'a [u8]> + Clone {
        let (n, w, at) = self.header();
        let data = at + w * n.saturating_sub(1);
        (0..n).scan(0usize, move |start, c| {
            let end = if c + 1 == n {
                self.0.len() - data
            } else {
                self.end(at, w, c)
            };
            let v = &self.0[data + *start..data + end];
            *start = end;
            Some(v)
        })
    }

    /// The bytes of the values, without the header.
    pub fn value_bytes(&self) -> usize {
        let (n, w, at) = self.header();
        self.0.len() - at - w * n.saturating_sub(1)
    }

    /// The values, owned.
    pub fn to_owned(self) -> Vals {
        Vals(self.0.into())
    }
}

#[cfg(test)]
mod tests {
    use super::Vals;

    #[test]
    fn vals_give_back_each_value_whatever_its_length() {
        let parts: [&[u8]; 4] = [b"", b"ab", &[0, 1, 2, 255], b""];
        let v = Vals::new(parts.iter().copied());
        assert_eq!(v.len(), 4);
        for (c, p) in parts.iter().enumerate() {
            assert_eq!(v.get(c), *p, "value {c}");
        }
        assert_eq!(v.iter().collect::<Vec<_>>(), parts.to_vec());
        assert_eq!(
            v.heap_bytes(),
            1 + 2 * 3 + 6,
            "a header byte, three 2-byte ends"
        );
        // Equal values, equal bytes: folds compare and hash them whole.
        assert_eq!(v, Vals::new(parts.iter().copied()));
        assert_ne!(
            v,
            Vals::new([b"".as_slice(), b"a", b"b", b"\0\x01\x02\xff"].into_iter())
        );
        let none = Vals::new(std::iter::empty());
        assert_eq!((none.len(), none.iter().count()), (0, 0));
        assert!(Vals::default().is_empty());
    }
}
