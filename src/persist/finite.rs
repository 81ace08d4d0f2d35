//! JSON saves refuse a float that is NaN or infinite. `serde_json` writes one as `null`, which loads back into no
//! float: the save would succeed and the world would then fail to load (its older save too, once the value had
//! been saved twice). The save fails instead, naming the field, and the previous save stays the one that loads.
//!
//! [`Finite`] wraps a serializer and hands everything to it unchanged, but a non-finite `f32` or `f64`, which it
//! refuses. Only a refused save walks its value a second time, to find the field's path for the message.

use std::fmt::Display;
use std::io::Write;

use serde::ser::{self, Error as _, Serialize, Serializer};

/// The start of the message of a refused float (how a refusal is told apart from the writer's own errors).
const NOT_FINITE: &str = "a float that is NaN or infinite";

/// Writes `value` as JSON into `out`, refusing a float that is NaN or infinite (the message names its field).
pub(crate) fn to_writer<T: Serialize + ?Sized>(out: impl Write, value: &T) -> Result<(), serde_json::Error> {
    write(out, value, None)
}

/// Like [`to_writer`], for element `index` of a sequence written in parts: a refusal names the field by its path
/// in the whole sequence, as writing the sequence at once would.
pub(crate) fn element_to_writer<T: Serialize + ?Sized>(
    out: impl Write,
    value: &T,
    index: usize,
) -> Result<(), serde_json::Error> {
    write(out, value, Some(index))
}

fn write<T: Serialize + ?Sized>(out: impl Write, value: &T, index: Option<usize>) -> Result<(), serde_json::Error> {
    let written = value.serialize(Finite(&mut serde_json::Serializer::new(out)));
    match written {
        Err(error) if error.is_data() && error.to_string().starts_with(NOT_FINITE) => {
            // Again, into nothing, to say where it is.
            let sink = &mut serde_json::Serializer::new(std::io::sink());
            let path = serde_path_to_error::serialize(value, Finite(sink)).err().map(|error| error.path().to_string());
            let field = match (index, path) {
                (_, None) => "?".to_string(),
                (None, Some(path)) => path,
                (Some(index), Some(path)) if path == "." => format!("[{index}]"),
                (Some(index), Some(path)) if path.starts_with('[') => format!("[{index}]{path}"),
                (Some(index), Some(path)) => format!("[{index}].{path}"),
            };
            Err(serde_json::Error::custom(format!(
                "{NOT_FINITE} (at `{field}`) cannot be saved as JSON (it would load back as null, into no float): keep \
                 saved floats finite, or save with postcard, which keeps them"
            )))
        }
        written => written,
    }
}

/// A serializer that refuses non-finite floats and otherwise is `S`.
struct Finite<S>(S);

/// `T` serialized through [`Finite`].
struct Checked<'a, T: ?Sized>(&'a T);

impl<T: Serialize + ?Sized> Serialize for Checked<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(Finite(serializer))
    }
}

fn finite<E: ser::Error>(finite: bool, value: impl Display) -> Result<(), E> {
    if finite {
        Ok(())
    } else {
        Err(E::custom(format_args!("{NOT_FINITE} ({value})")))
    }
}

macro_rules! pass {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {
        $(fn $method(self, $($arg: $ty),*) -> Result<S::Ok, S::Error> {
            self.0.$method($($arg),*)
        })*
    };
}

impl<S: Serializer> Serializer for Finite<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Finite<S::SerializeSeq>;
    type SerializeTuple = Finite<S::SerializeTuple>;
    type SerializeTupleStruct = Finite<S::SerializeTupleStruct>;
    type SerializeTupleVariant = Finite<S::SerializeTupleVariant>;
    type SerializeMap = Finite<S::SerializeMap>;
    type SerializeStruct = Finite<S::SerializeStruct>;
    type SerializeStructVariant = Finite<S::SerializeStructVariant>;

    pass! {
        serialize_bool(v: bool);
        serialize_i8(v: i8);
        serialize_i16(v: i16);
        serialize_i32(v: i32);
        serialize_i64(v: i64);
        serialize_i128(v: i128);
        serialize_u8(v: u8);
        serialize_u16(v: u16);
        serialize_u32(v: u32);
        serialize_u64(v: u64);
        serialize_u128(v: u128);
        serialize_char(v: char);
        serialize_str(v: &str);
        serialize_bytes(v: &[u8]);
        serialize_none();
        serialize_unit();
        serialize_unit_struct(name: &'static str);
        serialize_unit_variant(name: &'static str, index: u32, variant: &'static str);
    }

    fn serialize_f32(self, v: f32) -> Result<S::Ok, S::Error> {
        finite(v.is_finite(), v)?;
        self.0.serialize_f32(v)
    }

    fn serialize_f64(self, v: f64) -> Result<S::Ok, S::Error> {
        finite(v.is_finite(), v)?;
        self.0.serialize_f64(v)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        self.0.serialize_some(&Checked(value))
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, name: &'static str, value: &T) -> Result<S::Ok, S::Error> {
        self.0.serialize_newtype_struct(name, &Checked(value))
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0.serialize_newtype_variant(name, index, variant, &Checked(value))
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        self.0.serialize_seq(len).map(Finite)
    }

    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        self.0.serialize_tuple(len).map(Finite)
    }

    fn serialize_tuple_struct(self, name: &'static str, len: usize) -> Result<Self::SerializeTupleStruct, S::Error> {
        self.0.serialize_tuple_struct(name, len).map(Finite)
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        self.0.serialize_tuple_variant(name, index, variant, len).map(Finite)
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        self.0.serialize_map(len).map(Finite)
    }

    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Self::SerializeStruct, S::Error> {
        self.0.serialize_struct(name, len).map(Finite)
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        self.0.serialize_struct_variant(name, index, variant, len).map(Finite)
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// The compound serializers: each element, key, value and field through [`Checked`].
macro_rules! compound {
    ($($trait:ident { $($method:ident($($name:ident: $ty:ty,)*);)* })*) => {
        $(impl<S: ser::$trait> ser::$trait for Finite<S> {
            type Ok = S::Ok;
            type Error = S::Error;

            $(fn $method<T: Serialize + ?Sized>(&mut self, $($name: $ty,)* value: &T) -> Result<(), S::Error> {
                self.0.$method($($name,)* &Checked(value))
            })*

            fn end(self) -> Result<S::Ok, S::Error> {
                self.0.end()
            }
        })*
    };
}

compound! {
    SerializeSeq { serialize_element(); }
    SerializeTuple { serialize_element(); }
    SerializeTupleStruct { serialize_field(); }
    SerializeTupleVariant { serialize_field(); }
}

macro_rules! structure {
    ($($trait:ident)*) => {
        $(impl<S: ser::$trait> ser::$trait for Finite<S> {
            type Ok = S::Ok;
            type Error = S::Error;

            fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), S::Error> {
                self.0.serialize_field(key, &Checked(value))
            }

            fn skip_field(&mut self, key: &'static str) -> Result<(), S::Error> {
                self.0.skip_field(key)
            }

            fn end(self) -> Result<S::Ok, S::Error> {
                self.0.end()
            }
        })*
    };
}

structure! { SerializeStruct SerializeStructVariant }

impl<S: ser::SerializeMap> ser::SerializeMap for Finite<S> {
    type Ok = S::Ok;
    type Error = S::Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), S::Error> {
        self.0.serialize_key(&Checked(key))
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), S::Error> {
        self.0.serialize_value(&Checked(value))
    }

    fn end(self) -> Result<S::Ok, S::Error> {
        self.0.end()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Serialize;

    use super::*;

    #[derive(Serialize)]
    struct Creature {
        name: String,
        position: (f32, f32),
        speed: Option<f64>,
        tags: BTreeMap<String, Vec<f64>>,
    }

    fn creature() -> Creature {
        let tags = BTreeMap::from([("seen".to_string(), vec![1.5, 2.0])]);
        Creature { name: "moth".into(), position: (1.0, -2.5), speed: Some(0.25), tags }
    }

    fn written(value: &impl Serialize) -> Result<String, String> {
        let mut out = Vec::new();
        to_writer(&mut out, value).map_err(|error| error.to_string())?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    #[test]
    fn finite_values_are_written_exactly_as_serde_json_writes_them() {
        let value = creature();
        assert_eq!(written(&value), Ok(serde_json::to_string(&value).expect("json")));
        let odd =
            (Some(()), vec![None::<u8>], [-0.0f64, f64::MAX, f64::MIN_POSITIVE], 'x', i128::MIN, b"by".as_slice());
        assert_eq!(written(&odd), Ok(serde_json::to_string(&odd).expect("json")));
    }

    #[test]
    fn an_element_written_alone_is_refused_with_the_path_the_whole_sequence_would_give() {
        let mut records = vec![creature(), creature()];
        records[1].tags.insert("far".into(), vec![f64::NAN]);
        let mut whole = Vec::new();
        let mut parts = Vec::new();
        let (Err(whole), Err(part)) = (to_writer(&mut whole, &records), element_to_writer(&mut parts, &records[1], 1))
        else {
            panic!("refused")
        };
        assert_eq!(whole.to_string(), part.to_string());
        assert!(part.to_string().contains("`[1].tags.far[0]`"), "{part}");
        let floats = [1.0, f32::NAN];
        let whole = to_writer(Vec::new(), &floats).expect_err("refused").to_string();
        assert_eq!(whole, element_to_writer(Vec::new(), &floats[1], 1).expect_err("refused").to_string());
    }

    #[test]
    fn a_nan_or_infinite_float_is_refused_with_the_path_of_its_field() {
        let mut value = creature();
        value.position.1 = f32::NAN;
        let error = written(&value).expect_err("refused");
        assert!(error.starts_with(NOT_FINITE) && error.contains("`position[1]`"), "{error}");

        let mut value = creature();
        value.tags.insert("far".into(), vec![0.0, f64::INFINITY]);
        let error = written(&value).expect_err("refused");
        assert!(error.contains("`tags.far[1]`"), "{error}");

        let mut value = creature();
        value.speed = Some(f64::NEG_INFINITY);
        assert!(written(&value).expect_err("refused").contains("`speed`"));
    }
}
