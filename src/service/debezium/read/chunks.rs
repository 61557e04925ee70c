//! A body read where it lies: in one buffer, or in the chunks the HTTP
//! layer received it in (`Body`), never copied into one buffer. The
//! reader walks it with a `Cursor`; an element a chunk's end cuts is read
//! from a copy of itself in an arena. A chunk holds tens to hundreds of
//! KiB and a Debezium event about 2 KiB, so a body's bytes are copied
//! about 1% instead of once all (the copy was ~7% of the server's time on
//! a Debezium push, each event being 20x the bytes of its flat row).

use bumpalo::Bump;
use bytes::Bytes;

use crate::error::Result;

/// A request body, as one buffer or as its chunks in order.
#[derive(Clone, Copy)]
pub enum Body<'a> {
    Whole(&'a [u8]),
    /// The chunks, and the arena an element cut by a chunk's end is
    /// copied into (it lives as long as what is read from the body).
    Chunks(&'a [Bytes], &'a Bump),
}

/// A place in a body, and how to read the element there.
pub(super) struct Cursor<'a> {
    parts: Vec<&'a [u8]>,
    arena: Option<&'a Bump>,
    /// The part the cursor is in, its place in it, and the bytes before it.
    k: usize,
    i: usize,
    base: usize,
    len: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(body: Body<'a>) -> Cursor<'a> {
        let (parts, arena): (Vec<&'a [u8]>, _) = match body {
            Body::Whole(b) => (vec![b], None),
            Body::Chunks(c, arena) => (
                c.iter().map(|b| &b[..]).filter(|b| !b.is_empty()).collect(),
                Some(arena),
            ),
        };
        let len = parts.iter().map(|p| p.len()).sum();
        Cursor {
            parts,
            arena,
            k: 0,
            i: 0,
            base: 0,
            len,
        }
    }

    /// Past the ends of the parts it has read whole.
    fn settle(&mut self) {
        while let Some(p) = self.parts.get(self.k)
            && self.i == p.len()
            && self.k + 1 < self.parts.len()
        {
            self.base += p.len();
            self.k += 1;
            self.i = 0;
        }
    }

    /// The byte offset in the body.
    pub(super) fn at(&self) -> usize {
        self.base + self.i
    }

    pub(super) fn at_end(&self) -> bool {
        self.at() == self.len
    }

    pub(super) fn peek(&mut self) -> Option<u8> {
        self.settle();
        self.parts.get(self.k).and_then(|p| p.get(self.i)).copied()
    }

    pub(super) fn skip_ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    /// `n` bytes on (at most to the end).
    pub(super) fn advance(&mut self, mut n: usize) {
        loop {
            self.settle();
            let Some(p) = self.parts.get(self.k) else {
                return;
            };
            let left = p.len() - self.i;
            if n <= left || self.k + 1 == self.parts.len() {
                self.i += n.min(left);
                return;
            }
            n -= left;
            self.i = p.len();
        }
    }

    /// The bytes from here to the end of this part.
    fn here(&mut self) -> &'a [u8] {
        self.settle();
        self.parts.get(self.k).map_or(&[], |p| &p[self.i..])
    }

    /// The next `n` bytes, copied into one slice of the arena unless one
    /// part holds them.
    fn next_bytes(&mut self, n: usize) -> &'a [u8] {
        let here = self.here();
        if n <= here.len() {
            return &here[..n];
        }
        let Some(arena) = self.arena else {
            // One part holds the whole body; `n` is past its end.
            return here;
        };
        let out = arena.alloc_slice_fill_copy(n.min(self.len - self.at()), 0u8);
        let mut filled = 0;
        let mut k = self.k;
        let mut from = self.i;
        while filled < out.len() {
            let p = self.parts[k];
            let take = (p.len() - from).min(out.len() - filled);
            out[filled..filled + take].copy_from_slice(&p[from..from + take]);
            filled += take;
            k += 1;
            from = 0;
        }
        out
    }

    /// The whole body as one slice (copied into the arena when it came in
    /// chunks): for an error's wording, and for a body of one element.
    pub(super) fn whole(&self) -> &'a [u8] {
        match (self.parts.as_slice(), self.arena) {
            ([], _) => &[],
            ([one], _) => one,
            (_, None) => unreachable!("a body of several parts has an arena"),
            (parts, Some(arena)) => arena.alloc_slice_copy(&parts.concat()),
        }
    }

    /// Reads the element that starts here with `read`, which is given the
    /// bytes from its start and answers it and its length, and moves past
    /// it. `read` is first given the rest of this part; when it fails and
    /// the body goes on, it is given a copy of the element's bytes and more
    /// of the body, twice as much each time (a cut element is read again
    /// once or twice; a bad one is refused as it would be in one buffer).
    pub(super) fn element<T>(
        &mut self,
        mut read: impl FnMut(&'a [u8]) -> Result<(T, usize)>,
    ) -> Result<T> {
        let rest = self.len - self.at();
        let mut shown = self.here();
        loop {
            let got = read(shown);
            let all = shown.len() == rest;
            match got {
                // An element that ends where the bytes shown end may go on
                // (a number): shown more, unless they are all there is.
                Ok((t, n)) if n < shown.len() || all => {
                    self.advance(n);
                    return Ok(t);
                }
                Err(e) if all => return Err(e),
                _ => {}
            }
            let more = (shown.len() * 2).max(shown.len() + 16 * 1024).min(rest);
            shown = self.next_bytes(more);
        }
    }

    /// The next line (without its `\n`), copied only when a part's end
    /// cuts it; `None` at the end.
    pub(super) fn line(&mut self) -> Option<&'a [u8]> {
        if self.at_end() {
            return None;
        }
        let here = self.here();
        if let Some(n) = memchr::memchr(b'\n', here) {
            self.i += n + 1;
            return Some(&here[..n]);
        }
        // The line goes on into the next parts (or ends the body).
        let mut n = here.len();
        let mut newline = false;
        for p in &self.parts[self.k + 1..] {
            if let Some(j) = memchr::memchr(b'\n', p) {
                n += j;
                newline = true;
                break;
            }
            n += p.len();
        }
        let line = self.next_bytes(n);
        self.advance(n + usize::from(newline));
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(text: &[u8], cuts: &[usize]) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut from = 0;
        for &c in cuts {
            out.push(Bytes::copy_from_slice(&text[from..c]));
            from = c;
        }
        out.push(Bytes::copy_from_slice(&text[from..]));
        out
    }

    #[test]
    fn lines_are_the_same_wherever_the_chunks_end() {
        let text = b"ab\ncdef\n\nghi\nj";
        for a in 0..=text.len() {
            for b in a..=text.len() {
                let arena = Bump::new();
                let chunks = chunked(text, &[a, b]);
                let mut c = Cursor::new(Body::Chunks(&chunks, &arena));
                let mut lines = Vec::new();
                while let Some(l) = c.line() {
                    lines.push(l.to_vec());
                }
                let want: Vec<Vec<u8>> = text.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
                assert_eq!(lines, want, "cuts at {a}, {b}");
                assert!(c.at_end());
            }
        }
    }

    #[test]
    fn an_element_cut_by_a_chunk_is_read_from_a_copy() {
        // Elements are runs of one letter ended by `;`: read by a reader
        // that fails on a slice ending before the `;`.
        let text = b"aaa;bbbbbbb;c;dd;";
        let read = |s: &[u8]| -> Result<(Vec<u8>, usize)> {
            match memchr::memchr(b';', s) {
                Some(n) => Ok((s[..n].to_vec(), n + 1)),
                None => Err(crate::error::Error::Unavailable("cut".into())),
            }
        };
        for a in 0..=text.len() {
            for b in a..=text.len() {
                let arena = Bump::new();
                let chunks = chunked(text, &[a, b]);
                let mut c = Cursor::new(Body::Chunks(&chunks, &arena));
                let mut got = Vec::new();
                while !c.at_end() {
                    got.push(c.element(read).unwrap());
                }
                assert_eq!(
                    got,
                    vec![
                        b"aaa".to_vec(),
                        b"bbbbbbb".to_vec(),
                        b"c".to_vec(),
                        b"dd".to_vec()
                    ]
                );
            }
        }
        // An element that may go on past the bytes shown (digits, as a
        // JSON number) is shown more before it is taken.
        let digits = |s: &[u8]| -> Result<(usize, usize)> {
            let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
            Ok((n, n + usize::from(n < s.len())))
        };
        let text = b"1234,56789,1";
        for a in 0..=text.len() {
            let arena = Bump::new();
            let chunks = chunked(text, &[a]);
            let mut c = Cursor::new(Body::Chunks(&chunks, &arena));
            let got: Vec<usize> = (0..3).map(|_| c.element(digits).unwrap()).collect();
            assert_eq!(got, vec![4, 5, 1], "cut at {a}");
        }
        // A bad element is refused once the body has no more to show.
        let arena = Bump::new();
        let chunks = chunked(b"aa;bb", &[1]);
        let mut c = Cursor::new(Body::Chunks(&chunks, &arena));
        assert_eq!(c.element(read).unwrap(), b"aa");
        assert!(c.element(read).is_err());
    }

    #[test]
    fn whitespace_and_offsets_cross_chunks() {
        let text = b"  \n x";
        for a in 0..=text.len() {
            let arena = Bump::new();
            let chunks = chunked(text, &[a]);
            let mut c = Cursor::new(Body::Chunks(&chunks, &arena));
            c.skip_ws();
            assert_eq!((c.peek(), c.at()), (Some(b'x'), 4));
            assert_eq!(c.whole(), text);
        }
    }
}
