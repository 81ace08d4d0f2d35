//! Floats JSON cannot hold: `serde_json` writes a NaN or infinite `f32`/`f64` as `null`, which loads back into no
//! float and breaks a published `"type": "number"`. [`non_finite`] finds one in a value, by its path.

use std::fmt::Display;

use serde::ser::{self, Serialize, Serializer};
use serde_path_to_error::Segment;

/// What [`non_finite`]'s paths are the place of.
pub(crate) const NOT_FINITE: &str = "a float that is NaN or infinite";

/// The path of a NaN or infinite float in `value` (`[17].velocity[1]`; `.` for the value itself), if it has one;
/// `value` being element `index` of a sequence, its path in the sequence. Walks the value once, writing nothing; a
/// second time, tracking the path, only when it has one (`?` if that walk found none: a value whose `Serialize`
/// changed in between, such as shared state the game changed meanwhile).
pub(crate) fn non_finite<T: Serialize + ?Sized>(value: &T, index: Option<usize>) -> Option<String> {
    value.serialize(FloatCheck).err()?;
    let Some(refused) = serde_path_to_error::serialize(value, FloatCheck).err() else { return Some("?".into()) };
    let Some(index) = index else { return Some(refused.path().to_string()) };
    // As the sequence's own path prints: an index without a separator, anything else after a dot.
    let mut path = format!("[{index}]");
    for segment in refused.path() {
        let separator = if matches!(segment, Segment::Seq { .. }) { "" } else { "." };
        path.push_str(&format!("{separator}{segment}"));
    }
    Some(path)
}

/// A serializer that writes nothing and refuses a non-finite float: a value passes it if JSON can hold its floats.
struct FloatCheck;

/// Why [`FloatCheck`] refused a value.
#[derive(Debug)]
struct Refused(String);

impl Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl ser::Error for Refused {
    fn custom<M: Display>(message: M) -> Self {
        Refused(message.to_string())
    }
}

macro_rules! pass {
    ($($method:ident($($ty:ty),*);)*) => {
        $(fn $method(self, $(_: $ty),*) -> Result<(), Refused> {
            Ok(())
        })*
    };
}

impl Serializer for FloatCheck {
    type Ok = ();
    type Error = Refused;
    type SerializeSeq = FloatCheck;
    type SerializeTuple = FloatCheck;
    type SerializeTupleStruct = FloatCheck;
    type SerializeTupleVariant = FloatCheck;
    type SerializeMap = FloatCheck;
    type SerializeStruct = FloatCheck;
    type SerializeStructVariant = FloatCheck;

    pass! {
        serialize_bool(bool);
        serialize_i8(i8);
        serialize_i16(i16);
        serialize_i32(i32);
        serialize_i64(i64);
        serialize_i128(i128);
        serialize_u8(u8);
        serialize_u16(u16);
        serialize_u32(u32);
        serialize_u64(u64);
        serialize_u128(u128);
        serialize_char(char);
        serialize_str(&str);
        serialize_bytes(&[u8]);
        serialize_none();
        serialize_unit();
        serialize_unit_struct(&'static str);
        serialize_unit_variant(&'static str, u32, &'static str);
    }

    fn serialize_f32(self, v: f32) -> Result<(), Refused> {
        finite(v.is_finite(), v)
    }

    fn serialize_f64(self, v: f64) -> Result<(), Refused> {
        finite(v.is_finite(), v)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Refused> {
        value.serialize(self)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), Refused> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Result<(), Refused> {
        value.serialize(self)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self, Refused> {
        Ok(self)
    }

    fn serialize_tuple(self, _: usize) -> Result<Self, Refused> {
        Ok(self)
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, Refused> {
        Ok(self)
    }

    fn serialize_tuple_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Self, Refused> {
        Ok(self)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self, Refused> {
        Ok(self)
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Refused> {
        Ok(self)
    }

    fn serialize_struct_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Self, Refused> {
        Ok(self)
    }

    /// A string: nothing to check, and nothing to build.
    fn collect_str<T: Display + ?Sized>(self, _: &T) -> Result<(), Refused> {
        Ok(())
    }
}

fn finite(finite: bool, value: impl Display) -> Result<(), Refused> {
    if finite {
        Ok(())
    } else {
        Err(Refused(format!("{NOT_FINITE} ({value})")))
    }
}

/// The compound serializers: every element, key, value and field is checked.
macro_rules! compound {
    ($($trait:ident { $($method:ident($($ty:ty,)*);)* })*) => {
        $(impl ser::$trait for FloatCheck {
            type Ok = ();
            type Error = Refused;

            $(fn $method<T: Serialize + ?Sized>(&mut self, $(_: $ty,)* value: &T) -> Result<(), Refused> {
                value.serialize(FloatCheck)
            })*

            fn end(self) -> Result<(), Refused> {
                Ok(())
            }
        })*
    };
}

compound! {
    SerializeSeq { serialize_element(); }
    SerializeTuple { serialize_element(); }
    SerializeTupleStruct { serialize_field(); }
    SerializeTupleVariant { serialize_field(); }
    SerializeMap { serialize_key(); serialize_value(); }
    SerializeStruct { serialize_field(&'static str,); }
    SerializeStructVariant { serialize_field(&'static str,); }
}
