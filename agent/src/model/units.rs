//! Sizes and durations as operators write them: `512MiB`, `1G`, `1048576`;
//! `90s`, `2m`.

use std::{fmt, time::Duration};

use serde::{Deserialize, Deserializer, de};

/// A size in bytes. Units are powers of 1024 whatever their spelling
/// (`1G` = `1GiB` = 2^30), as in systemd, Slurm and Docker memory limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl Size {
    pub fn parse(text: &str) -> Result<Size, String> {
        parse_size::Config::new()
            .with_binary()
            .parse_size(text.trim())
            .map(Size)
            .map_err(|e| format!("`{text}` is not a size ({e}); write e.g. 512MiB, 1G or 1048576"))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(n) => Ok(Size(n)),
            Raw::Text(text) => Size::parse(&text).map_err(de::Error::custom),
        }
    }
}

/// A duration written like `90s`, `2m`, `1h 30m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span(pub Duration);

impl Span {
    pub fn parse(text: &str) -> Result<Span, String> {
        humantime::parse_duration(text.trim())
            .map(Span)
            .map_err(|e| format!("`{text}` is not a duration ({e}); write e.g. 90s or 2m"))
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Span::parse(&text).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary_whatever_the_spelling() {
        for (text, bytes) in [
            ("512MiB", 512 << 20),
            ("64M", 64 << 20),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
            ("1048576", 1 << 20),
            ("2 KiB", 2048),
        ] {
            assert_eq!(Size::parse(text), Ok(Size(bytes)), "{text}");
        }
        assert!(
            Size::parse("lots")
                .unwrap_err()
                .contains("`lots` is not a size")
        );
    }

    #[test]
    fn durations() {
        assert_eq!(Span::parse("90s").unwrap().0, Duration::from_secs(90));
        assert_eq!(Span::parse("2m").unwrap().0, Duration::from_secs(120));
        assert!(Span::parse("soon").unwrap_err().contains("not a duration"));
    }

    #[test]
    fn sizes_deserialize_from_numbers_and_strings() {
        #[derive(Deserialize)]
        struct T {
            a: Size,
            b: Size,
        }
        let t: T = toml::from_str("a = 4096\nb = \"1MiB\"").unwrap();
        assert_eq!((t.a, t.b), (Size(4096), Size(1 << 20)));
    }
}
