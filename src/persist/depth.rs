//! A nesting limit for decoders that have none (postcard): a save is read by recursion, native stack frames per
//! level, so a small damaged or crafted file of a recursive game type (`Option<Box<Node>>`, one byte per level)
//! would overflow the stack and abort the game, every time the world is entered. Past [`MAX_DEPTH`] levels the
//! decode fails with an error instead, as `serde_json`'s own limit makes a JSON save's.
//!
//! [`Limited`] wraps a `Deserializer` and every visitor, seed and access it hands on, counting the levels entered
//! through a sequence, map, enum, `Some` or newtype.

use std::cell::Cell;

use serde::de::{self, Deserialize, DeserializeSeed, Visitor};

/// The deepest nesting a save may have, counting a level for each struct, tuple, sequence, map, enum, `Some` and
/// newtype (each one recursion of the decoder). serde_json stops at 128 arrays or objects, where a `Some` or a
/// newtype is none: twice that here keeps a recursive type through `Option<Box<_>>` (a struct and a `Some` a
/// level each) about as deep in both codecs (128).
pub(crate) const MAX_DEPTH: usize = 256;

/// Why [`deserialize`] failed.
#[derive(Debug)]
pub(crate) enum Refused<E> {
    /// The document nests deeper than [`MAX_DEPTH`] levels (a decoder's own error may not say so: postcard's
    /// custom errors carry no message).
    TooDeep,
    /// The decoder's own error.
    Decode(E),
}

impl<E: std::fmt::Display> std::fmt::Display for Refused<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::TooDeep => write!(f, "the document nests deeper than {MAX_DEPTH} levels"),
            Refused::Decode(error) => error.fmt(f),
        }
    }
}

/// Deserializes a `T` from `deserializer`, at most [`MAX_DEPTH`] levels deep.
pub(crate) fn deserialize<'de, T: Deserialize<'de>, D: de::Deserializer<'de>>(
    deserializer: D,
) -> Result<T, Refused<D::Error>> {
    let too_deep = Cell::new(false);
    T::deserialize(Limited { inner: deserializer, left: MAX_DEPTH, too_deep: &too_deep }).map_err(|error| {
        if too_deep.get() {
            Refused::TooDeep
        } else {
            Refused::Decode(error)
        }
    })
}

/// A deserializer (or a visitor, seed or access) with `left` levels still allowed under it; `too_deep` is set
/// when a level past the limit was refused.
struct Limited<'a, T> {
    inner: T,
    left: usize,
    too_deep: &'a Cell<bool>,
}

/// Another part of the same document, `left` levels allowed under it.
fn part<U>(inner: U, left: usize, too_deep: &Cell<bool>) -> Limited<'_, U> {
    Limited { inner, left, too_deep }
}

impl<T> Limited<'_, T> {
    /// One level down, or the error the decode fails with past the limit.
    fn deeper<E: de::Error>(&self) -> Result<usize, E> {
        self.left.checked_sub(1).ok_or_else(|| {
            self.too_deep.set(true);
            E::custom(format!("nested deeper than {MAX_DEPTH} levels"))
        })
    }
}

macro_rules! forward_deserialize {
    ($($method:ident $(($($arg:ident: $ty:ty),*))?;)*) => {$(
        fn $method<V: Visitor<'de>>(self, $($($arg: $ty,)*)? visitor: V) -> Result<V::Value, Self::Error> {
            self.inner.$method($($($arg,)*)? part(visitor, self.left, self.too_deep))
        }
    )*};
}

impl<'de, D: de::Deserializer<'de>> de::Deserializer<'de> for Limited<'_, D> {
    type Error = D::Error;

    forward_deserialize! {
        deserialize_any; deserialize_bool; deserialize_i8; deserialize_i16; deserialize_i32; deserialize_i64;
        deserialize_i128; deserialize_u8; deserialize_u16; deserialize_u32; deserialize_u64; deserialize_u128;
        deserialize_f32; deserialize_f64; deserialize_char; deserialize_str; deserialize_string; deserialize_bytes;
        deserialize_byte_buf; deserialize_option; deserialize_unit; deserialize_seq; deserialize_map;
        deserialize_identifier; deserialize_ignored_any;
        deserialize_unit_struct(name: &'static str);
        deserialize_newtype_struct(name: &'static str);
        deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_struct(name: &'static str, fields: &'static [&'static str]);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty);)*) => {$(
        fn $method<E: de::Error>(self, value: $ty) -> Result<V::Value, E> {
            self.inner.$method(value)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Limited<'_, V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.inner.expecting(formatter)
    }

    forward_visit! {
        visit_bool(bool); visit_i8(i8); visit_i16(i16); visit_i32(i32); visit_i64(i64); visit_i128(i128);
        visit_u8(u8); visit_u16(u16); visit_u32(u32); visit_u64(u64); visit_u128(u128); visit_f32(f32);
        visit_f64(f64); visit_char(char); visit_str(&str); visit_borrowed_str(&'de str); visit_string(String);
        visit_bytes(&[u8]); visit_borrowed_bytes(&'de [u8]); visit_byte_buf(Vec<u8>);
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        let left = self.deeper()?;
        self.inner.visit_some(part(deserializer, left, self.too_deep))
    }

    fn visit_newtype_struct<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        let left = self.deeper()?;
        self.inner.visit_newtype_struct(part(deserializer, left, self.too_deep))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        let left = self.deeper()?;
        self.inner.visit_seq(part(seq, left, self.too_deep))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let left = self.deeper()?;
        self.inner.visit_map(part(map, left, self.too_deep))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        let left = self.deeper()?;
        self.inner.visit_enum(part(data, left, self.too_deep))
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Limited<'_, S> {
    type Value = S::Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(part(deserializer, self.left, self.too_deep))
    }
}

impl<'de, A: de::SeqAccess<'de>> de::SeqAccess<'de> for Limited<'_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        self.inner.next_element_seed(part(seed, self.left, self.too_deep))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: de::MapAccess<'de>> de::MapAccess<'de> for Limited<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.inner.next_key_seed(part(seed, self.left, self.too_deep))
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.inner.next_value_seed(part(seed, self.left, self.too_deep))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, 'a, A: de::EnumAccess<'de>> de::EnumAccess<'de> for Limited<'a, A> {
    type Error = A::Error;
    type Variant = Limited<'a, A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Self::Variant), A::Error> {
        let (tag, variant) = self.inner.variant_seed(part(seed, self.left, self.too_deep))?;
        Ok((tag, part(variant, self.left, self.too_deep)))
    }
}

impl<'de, A: de::VariantAccess<'de>> de::VariantAccess<'de> for Limited<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.inner.newtype_variant_seed(part(seed, self.left, self.too_deep))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.inner.tuple_variant(len, part(visitor, self.left, self.too_deep))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.inner.struct_variant(fields, part(visitor, self.left, self.too_deep))
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    /// A recursive game type: each level is one byte in postcard (`Some`).
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Node {
        next: Option<Box<Node>>,
    }

    /// Another: each level is an enum tag and a sequence length.
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    enum Tree {
        Leaf(u32),
        Branch(Vec<Tree>),
    }

    fn decode<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, Refused<postcard::Error>> {
        deserialize(&mut postcard::Deserializer::from_bytes(bytes))
    }

    fn chain(levels: usize) -> Node {
        (0..levels).fold(Node { next: None }, |inner, _| Node { next: Some(Box::new(inner)) })
    }

    #[test]
    fn documents_within_the_limit_read_as_without_it() {
        // A struct (a sequence in postcard) and its `Some` are two levels each.
        let node = chain(MAX_DEPTH / 2 - 1);
        let bytes = postcard::to_stdvec(&node).unwrap();
        assert_eq!(decode::<Node>(&bytes).unwrap(), node);
        let tree = Tree::Branch(vec![Tree::Leaf(1), Tree::Branch(vec![Tree::Leaf(2)]), Tree::Branch(vec![])]);
        let bytes = postcard::to_stdvec(&tree).unwrap();
        assert_eq!(decode::<Tree>(&bytes).unwrap(), tree);
        let mixed = (7u8, String::from("bed"), vec![Some(3u64), None], std::collections::BTreeMap::from([(1, 2)]));
        let bytes = postcard::to_stdvec(&mixed).unwrap();
        assert_eq!(
            decode::<(u8, String, Vec<Option<u64>>, std::collections::BTreeMap<i32, i32>)>(&bytes).unwrap(),
            mixed
        );
    }

    #[test]
    fn a_document_nested_past_the_limit_is_an_error_not_a_stack_overflow() {
        // One million levels in a megabyte: without the limit this overflows any thread's stack and aborts.
        let mut bytes = vec![1u8; 1_000_000];
        bytes.push(0);
        assert!(matches!(decode::<Node>(&bytes), Err(Refused::TooDeep)));
        let mut bytes = [1u8, 1].repeat(500_000);
        bytes.extend([0, 0]);
        assert!(matches!(decode::<Tree>(&bytes), Err(Refused::TooDeep)));
        // Just past the limit fails as well: the limit, not the stack, stops it.
        let bytes = postcard::to_stdvec(&chain(MAX_DEPTH / 2 + 1)).unwrap();
        assert!(matches!(decode::<Node>(&bytes), Err(Refused::TooDeep)));
        // A decoder's own errors stay its own.
        assert!(matches!(decode::<Node>(&[1, 1]), Err(Refused::Decode(postcard::Error::DeserializeUnexpectedEnd))));
    }
}
