//! Row images (`before`, `after`): their fields in order, values unread
//! (`Fields`), or what an image is instead of an object (`Image::Not`).

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};

use super::{Key, Raw};

/// The fields of a row image, in order, values unread.
#[derive(Debug)]
pub(in crate::service::debezium) struct Fields<'a>(
    pub(in crate::service::debezium) Vec<(Cow<'a, str>, Raw<'a>)>,
);

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Map;
        impl<'de> Visitor<'de> for Map {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                m: A,
            ) -> std::result::Result<Fields<'de>, A::Error> {
                Fields::visit(m)
            }
        }
        d.deserialize_map(Map)
    }
}

impl<'de> Fields<'de> {
    fn visit<A: MapAccess<'de>>(mut m: A) -> std::result::Result<Fields<'de>, A::Error> {
        let mut out = Vec::with_capacity(m.size_hint().unwrap_or(8).min(256));
        while let Some(Key(k)) = m.next_key()? {
            let v: Raw<'de> = m.next_value()?;
            out.push((k, v));
        }
        Ok(Fields(out))
    }
}

/// A row image (`before`, `after`): its fields, or what it is instead.
#[derive(Debug)]
pub(in crate::service::debezium) enum Image<'a> {
    Row(Fields<'a>),
    /// Not an object: its kind, for errors.
    Not(&'static str),
}

/// An image present in an event (null too: `Image::Not("null")`).
pub(super) fn image<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Image<'de>>, D::Error> {
    struct Any;
    impl<'de> Visitor<'de> for Any {
        type Value = Image<'de>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a row image")
        }
        fn visit_map<A: MapAccess<'de>>(self, m: A) -> std::result::Result<Image<'de>, A::Error> {
            Fields::visit(m).map(Image::Row)
        }
        fn visit_unit<E>(self) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("null"))
        }
        fn visit_bool<E>(self, _: bool) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("a boolean"))
        }
        fn visit_i64<E>(self, _: i64) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("a number"))
        }
        fn visit_u64<E>(self, _: u64) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("a number"))
        }
        fn visit_f64<E>(self, _: f64) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("a number"))
        }
        fn visit_str<E>(self, _: &str) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("a string"))
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut s: A,
        ) -> std::result::Result<Image<'de>, A::Error> {
            while s.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(Image::Not("an array"))
        }
    }
    d.deserialize_any(Any).map(Some)
}
