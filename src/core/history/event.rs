//! `Event`: one applied change of a key (flags, fingerprint, location,
//! delete time, sequence and values) in one allocation, as the state holds
//! every event of every key.

use super::vals::{ValsRef, leb128_len, push_leb128, push_vals, read_leb128, vals_len, vals_shape};
use crate::core::state::{Loc, prefetch};

/// One applied change of a key, in one allocation.
///
/// A history flow holds every event of every key, so an event's size is
/// the state's size: the struct is one pointer and length, and the bytes
/// hold, in order, the flags (u8), the fingerprint (u64), the location
/// (file and position, u32 each; zero unless `LOCATED`), the delete time
/// (i64, only when `DELETED`), the sequence's length (LEB128, one byte
/// below 128), the row-encoded sequence (`Codec::seqs`), then the encoded value
/// columns (`Vals`' layout). Integers are little-endian.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    data: Box<[u8]>,
}

/// `Event::flags`: a delete.
const DELETED: u8 = 1;
/// `Event::flags`: `loc` is known.
const LOCATED: u8 = 2;
/// `Event::flags`: changed since the last state commit (new, or its
/// location, values or fingerprint moved): an appending history writes
/// only these.
const CHANGED: u8 = 4;

/// Where an event's fingerprint, location and delete time sit.
const FP_AT: usize = 1;
const LOC_AT: usize = 9;
const DELETED_AT: usize = 17;

impl Event {
    pub fn new<'a>(
        seq: &[u8],
        vals: impl Iterator<Item = &'a [u8]> + Clone,
        fp: u64,
        deleted_at_ms: Option<i64>,
        loc: Option<Loc>,
    ) -> Event {
        let head = DELETED_AT + if deleted_at_ms.is_some() { 8 } else { 0 };
        let shape = vals_shape(vals.clone());
        let seq_head = leb128_len(seq.len() as u64);
        let mut data = Vec::with_capacity(head + seq_head + seq.len() + vals_len(shape));
        data.push(if deleted_at_ms.is_some() { DELETED } else { 0 });
        data.extend_from_slice(&fp.to_le_bytes());
        data.extend_from_slice(&[0; 8]);
        if let Some(t) = deleted_at_ms {
            data.extend_from_slice(&t.to_le_bytes());
        }
        push_leb128(&mut data, seq.len() as u64);
        data.extend_from_slice(seq);
        push_vals(&mut data, vals, shape);
        let mut e = Event {
            data: data.into_boxed_slice(),
        };
        e.set_loc(loc);
        e
    }

    #[inline]
    fn flags(&self) -> u8 {
        self.data[0]
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.data[at..at + 8].try_into().expect("8 bytes"))
    }

    /// (start, length) of the sequence.
    #[inline]
    fn seq_span(&self) -> (usize, usize) {
        let at = DELETED_AT + 8 * (self.flags() & DELETED != 0) as usize;
        let (len, head) = read_leb128(&self.data[at..]);
        (at + head, len as usize)
    }

    /// Fingerprint of the whole change: decides ties, spots duplicates.
    #[inline]
    pub fn fp(&self) -> u64 {
        self.u64_at(FP_AT)
    }

    /// The row-encoded sequence (`Codec::seqs`).
    #[inline]
    pub fn seq(&self) -> &[u8] {
        let (at, len) = self.seq_span();
        &self.data[at..at + len]
    }

    /// The value columns, encoded (`HistCodec`).
    #[inline]
    pub fn vals(&self) -> ValsRef<'_> {
        let (at, len) = self.seq_span();
        ValsRef(&self.data[at + len..])
    }

    /// The same change with other values.
    pub(super) fn with_vals(&self, vals: ValsRef<'_>) -> Event {
        let mut e = Event::new(
            self.seq(),
            vals.iter(),
            self.fp(),
            self.deleted_at_ms(),
            self.loc(),
        );
        e.data[0] = self.flags();
        e
    }

    #[inline]
    pub fn is_delete(&self) -> bool {
        self.flags() & DELETED != 0
    }

    /// Commit time of a delete; None for an upsert.
    pub fn deleted_at_ms(&self) -> Option<i64> {
        self.is_delete().then(|| self.u64_at(DELETED_AT) as i64)
    }

    /// Where the target row this event anchors sits: the version it opens
    /// (SCD Type 2) or the current row it last updated (SCD Type 1).
    pub fn loc(&self) -> Option<Loc> {
        (self.flags() & LOCATED != 0).then(|| {
            let l = self.u64_at(LOC_AT);
            Loc {
                file: l as u32,
                pos: (l >> 32) as u32,
            }
        })
    }

    pub fn set_loc(&mut self, loc: Option<Loc>) {
        let (l, flag) = match loc {
            Some(l) => ((l.pos as u64) << 32 | l.file as u64, LOCATED),
            None => (0, 0),
        };
        self.data[LOC_AT..LOC_AT + 8].copy_from_slice(&l.to_le_bytes());
        self.data[0] = (self.data[0] & !LOCATED) | flag;
    }

    /// Changed since the last state commit.
    pub fn changed(&self) -> bool {
        self.flags() & CHANGED != 0
    }

    pub fn set_changed(&mut self, changed: bool) {
        if changed {
            self.data[0] |= CHANGED;
        } else {
            self.data[0] &= !CHANGED;
        }
    }

    /// The same change at the same place, whether or not either is marked
    /// changed.
    pub(super) fn same_as(&self, other: &Event) -> bool {
        self.data[1..] == other.data[1..] && (self.flags() | CHANGED) == (other.flags() | CHANGED)
    }

    /// Heap and inline bytes held.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Event>() + self.data.len()
    }

    /// Starts loading the event's bytes without waiting for them
    /// (`state::prefetch`): walks over keys ask for a key's latest events
    /// ahead (`History::prefetch_ahead`).
    #[inline]
    pub(super) fn prefetch(&self) {
        prefetch(&*self.data);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::Event;
    use crate::core::history::Vals;
    use crate::core::state::Loc;

    /// An event of one byte of sequence and two values (`val`, "x"), its
    /// fingerprint the sequence (the arena's and `apply`'s tests).
    pub(in crate::core::history) fn ev(
        seq: u8,
        val: &[u8],
        deleted_at_ms: Option<i64>,
        loc: Option<Loc>,
    ) -> Event {
        Event::new(
            &[seq],
            [val, b"x"].into_iter(),
            seq as u64,
            deleted_at_ms,
            loc,
        )
    }

    #[test]
    fn an_event_gives_back_what_it_was_made_of() {
        let loc = Loc { file: 3, pos: 9 };
        let mut e = Event::new(
            b"\x01seq",
            [b"a".as_slice(), b""].into_iter(),
            7,
            None,
            Some(loc),
        );
        assert_eq!(e.seq(), b"\x01seq");
        assert_eq!(
            e.vals().iter().collect::<Vec<_>>(),
            vec![b"a".as_slice(), b""]
        );
        assert_eq!(
            (e.fp(), e.deleted_at_ms(), e.loc(), e.is_delete()),
            (7, None, Some(loc), false)
        );
        assert!(!e.changed());
        e.set_changed(true);
        e.set_loc(None);
        assert!(e.changed() && e.loc().is_none());
        let d = Event::new(b"", std::iter::empty(), 1, Some(0), None);
        assert_eq!(
            (d.seq(), d.vals().len(), d.deleted_at_ms()),
            (&b""[..], 0, Some(0))
        );
        assert!(d.is_delete());
        // One allocation behind one pointer and length.
        assert_eq!(std::mem::size_of::<Event>(), 16);
    }

    #[test]
    fn events_and_values_of_any_size_round_trip() {
        // Sequences around the one-byte length (127, 128), values around the 2-byte
        // offsets, counts around the one-byte header, negative times.
        let long = vec![7u8; 70_000];
        for seq_len in [0usize, 1, 127, 128, 255, 256, 300] {
            for (ncols, big) in [
                (0usize, false),
                (1, false),
                (1, true),
                (3, true),
                (63, false),
                (64, false),
                (200, true),
            ] {
                let seq: Vec<u8> = (0..seq_len).map(|i| i as u8).collect();
                let vals: Vec<&[u8]> = (0..ncols)
                    .map(|c| {
                        if big && c == ncols / 2 {
                            &long[..]
                        } else {
                            &long[..c % 5]
                        }
                    })
                    .collect();
                let loc = Loc {
                    file: u32::MAX,
                    pos: 0x8000_0001,
                };
                for del in [None, Some(-5i64), Some(i64::MAX)] {
                    let mut e =
                        Event::new(&seq, vals.iter().copied(), u64::MAX - 1, del, Some(loc));
                    assert_eq!(e.seq(), &seq[..]);
                    assert_eq!(e.vals().iter().collect::<Vec<_>>(), vals);
                    assert_eq!(
                        (e.fp(), e.deleted_at_ms(), e.loc()),
                        (u64::MAX - 1, del, Some(loc))
                    );
                    e.set_loc(None);
                    e.set_changed(true);
                    assert_eq!((e.loc(), e.changed(), e.deleted_at_ms()), (None, true, del));
                    assert_eq!(
                        e.seq(),
                        &seq[..],
                        "flags and location leave the sequence be"
                    );
                    let v = Vals::new(vals.iter().copied());
                    assert_eq!(
                        (v.len(), v.iter().collect::<Vec<_>>()),
                        (ncols, vals.clone())
                    );
                    assert_eq!(v.as_ref(), e.vals());
                }
            }
        }
        // Short values take a one-byte header and 2-byte offsets.
        assert_eq!(
            Vals::new([&b"ab"[..], b"c", b"de"].into_iter()).heap_bytes(),
            1 + 2 * 2 + 5
        );
        assert_eq!(Vals::default().len(), 0);
    }
}
