//! JSON saves refuse a float that is NaN or infinite. `serde_json` writes one as `null`, which loads back into no
//! float: the save would succeed and the world would then fail to load (its older save too, once the value had
//! been saved twice). The save fails instead, naming the field, and the previous save stays the one that loads.
//!
//! At no cost to a save without `null`s: the JSON is written as `serde_json` writes it, noting whether it wrote a
//! `null`. Only then is the value walked again for a non-finite `f32` or `f64` ([`crate::finite`], which writes
//! nothing; a `null` may also be a `None` or a `()`).
//!
//! For the same reason a save refuses a document nested deeper than `serde_json` reads back ([`JSON_DEPTH`] arrays
//! and objects): written, it would load as damaged and the previous save would be the one that loads.

use std::io::{self, Write};

use serde::ser::{self, Serialize};

use crate::finite::{non_finite, NOT_FINITE};

/// The most arrays and objects inside one another `serde_json` reads (its recursion limit, 128, counts down to
/// the first it refuses).
pub(crate) const JSON_DEPTH: usize = 127;

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
    let mut too_deep = false;
    // An element of a sequence is inside that sequence's array.
    let depth = usize::from(index.is_some());
    let formatter = Watch { null: &mut null, depth, too_deep: &mut too_deep };
    let written = value.serialize(&mut serde_json::Serializer::with_formatter(out, formatter));
    if too_deep {
        return Err(ser::Error::custom(format!(
            "the document nests deeper than {JSON_DEPTH} arrays or objects, more than a JSON save loads back: keep \
             a recursive saved type shallower"
        )));
    }
    written?;
    let Some(field) = null.then(|| non_finite(value, index)).flatten() else { return Ok(()) };
    Err(ser::Error::custom(format!(
        "{NOT_FINITE} (at `{field}`) cannot be saved as JSON (it would load back as null, into no float): keep saved \
         floats finite, or save with postcard, which keeps them"
    )))
}

/// `serde_json`'s compact output, noting whether it wrote a `null`, and stopping past [`JSON_DEPTH`].
struct Watch<'a> {
    null: &'a mut bool,
    /// Arrays and objects open.
    depth: usize,
    too_deep: &'a mut bool,
}

impl Watch<'_> {
    #[inline]
    fn enter(&mut self) -> io::Result<()> {
        self.depth += 1;
        if self.depth > JSON_DEPTH {
            *self.too_deep = true;
            return Err(io::Error::other("too deep"));
        }
        Ok(())
    }
}

impl serde_json::ser::Formatter for Watch<'_> {
    #[inline]
    fn write_null<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        *self.null = true;
        writer.write_all(b"null")
    }

    #[inline]
    fn begin_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.enter()?;
        writer.write_all(b"[")
    }

    #[inline]
    fn end_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth -= 1;
        writer.write_all(b"]")
    }

    #[inline]
    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.enter()?;
        writer.write_all(b"{")
    }

    #[inline]
    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.depth -= 1;
        writer.write_all(b"}")
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

    /// A recursive saved type: a chain of `depth` links.
    #[derive(Serialize, serde::Deserialize)]
    struct Link {
        next: Option<Box<Link>>,
    }

    fn chain(depth: usize) -> Link {
        (1..depth).fold(Link { next: None }, |next, _| Link { next: Some(Box::new(next)) })
    }

    #[test]
    fn a_document_saves_exactly_as_deep_as_json_loads_back() {
        for depth in 120..135 {
            let mut out = Vec::new();
            let saved = to_writer(&mut out, &chain(depth));
            let loads = serde_json::from_slice::<Link>(&serde_json::to_vec(&chain(depth)).expect("json")).is_ok();
            assert_eq!(saved.is_ok(), loads, "depth {depth}: {saved:?}");
            if let Err(error) = saved {
                assert!(error.to_string().contains("nests deeper than 127"), "{error}");
                assert!(error.io_error_kind().is_none(), "the document's fault, not the disk's: {error}");
            }
            // An element written alone is inside the whole sequence's array.
            let element = element_to_writer(Vec::new(), &chain(depth), 0).is_ok();
            let whole = serde_json::to_vec(&vec![chain(depth)]).expect("json");
            assert_eq!(element, serde_json::from_slice::<Vec<Link>>(&whole).is_ok(), "element at depth {depth}");
        }
    }
}
