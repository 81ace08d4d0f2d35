//! JSON saves refuse a float that is NaN or infinite. `serde_json` writes one as `null`, which loads back into no
//! float: the save would succeed and the world would then fail to load (its older save too, once the value had
//! been saved twice). The save fails instead, naming the field, and the previous save stays the one that loads.
//!
//! At no cost to a save without `null`s: the JSON is written as `serde_json` writes it, noting whether it wrote a
//! `null`. Only then is the value walked again for a non-finite `f32` or `f64` ([`crate::finite`], which writes
//! nothing; a `null` may also be a `None` or a `()`).

use std::io::{self, Write};

use serde::ser::{self, Serialize};

use crate::finite::{non_finite, NOT_FINITE};

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
    let mut null = false;
    value.serialize(&mut serde_json::Serializer::with_formatter(out, NullSeen(&mut null)))?;
    let Some(field) = null.then(|| non_finite(value, index)).flatten() else { return Ok(()) };
    Err(ser::Error::custom(format!(
        "{NOT_FINITE} (at `{field}`) cannot be saved as JSON (it would load back as null, into no float): keep saved \
         floats finite, or save with postcard, which keeps them"
    )))
}

/// `serde_json`'s compact output, noting whether it wrote a `null`.
struct NullSeen<'a>(&'a mut bool);

impl serde_json::ser::Formatter for NullSeen<'_> {
    #[inline]
    fn write_null<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        *self.0 = true;
        writer.write_all(b"null")
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
        let nested = vec![vec![0.0, 1.0], vec![2.0, f64::NAN]];
        let whole = to_writer(Vec::new(), &nested).expect_err("refused").to_string();
        assert_eq!(whole, element_to_writer(Vec::new(), &nested[1], 1).expect_err("refused").to_string());
        assert!(whole.contains("`[1][1]`"), "{whole}");
        let keys = vec![BTreeMap::from([(".".to_string(), f64::NAN)])];
        let whole = to_writer(Vec::new(), &keys).expect_err("refused").to_string();
        assert_eq!(whole, element_to_writer(Vec::new(), &keys[0], 0).expect_err("refused").to_string());
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
