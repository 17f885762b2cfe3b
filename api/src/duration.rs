//! Durations as neuron-monitor writes them: an integer or decimal number followed by
//! `ms`, `s`, `m` or `h` (`"500ms"`, `"1s"`, `"1.5s"`, `"2m"`).

use std::{fmt, str::FromStr, time::Duration};

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// A period of neuron-monitor, kept at millisecond precision (its own resolution).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Period(Duration);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeriodError {
    #[error("empty duration")]
    Empty,
    #[error("duration {0:?} has no unit; use ms, s, m or h (for example \"5s\")")]
    MissingUnit(String),
    #[error("duration {0:?} has an unknown unit; use ms, s, m or h")]
    UnknownUnit(String),
    #[error("duration {0:?} is not a number followed by a unit")]
    BadNumber(String),
    #[error("duration {0:?} is shorter than 1ms")]
    TooShort(String),
    #[error("duration {0:?} is too long")]
    TooLong(String),
}

impl Period {
    pub const fn from_millis(ms: u64) -> Self {
        Period(Duration::from_millis(ms))
    }

    pub const fn from_secs(s: u64) -> Self {
        Period(Duration::from_secs(s))
    }

    pub fn as_duration(self) -> Duration {
        self.0
    }

    pub fn as_millis(self) -> u64 {
        // Construction keeps this far below u64::MAX (see `TooLong`).
        self.0.as_millis() as u64
    }
}

impl From<Period> for Duration {
    fn from(p: Period) -> Duration {
        p.0
    }
}

/// Longest accepted period: a day. Nothing useful is sampled less often, and the bound
/// keeps arithmetic on periods far from overflow.
const MAX_MILLIS: f64 = 86_400_000.0;

impl FromStr for Period {
    type Err = PeriodError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(PeriodError::Empty);
        }
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| PeriodError::MissingUnit(s.to_owned()))?;
        let (number, unit) = s.split_at(split);
        let scale = match unit {
            "ms" => 1.0,
            "s" => 1_000.0,
            "m" => 60_000.0,
            "h" => 3_600_000.0,
            _ => return Err(PeriodError::UnknownUnit(s.to_owned())),
        };
        let value: f64 = number.parse().map_err(|_| PeriodError::BadNumber(s.to_owned()))?;
        let millis = (value * scale).round();
        if millis < 1.0 {
            return Err(PeriodError::TooShort(s.to_owned()));
        }
        if millis > MAX_MILLIS {
            return Err(PeriodError::TooLong(s.to_owned()));
        }
        Ok(Period::from_millis(millis as u64))
    }
}

impl fmt::Display for Period {
    /// The largest unit that represents the period exactly, so that output is canonical
    /// (`60000ms` prints as `1m`) and a rendered configuration is deterministic.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.as_millis();
        for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
            if ms.is_multiple_of(size) {
                return write!(f, "{}{unit}", ms / size);
            }
        }
        write!(f, "{ms}ms")
    }
}

impl Serialize for Period {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Period {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!("500ms".parse::<Period>().unwrap().as_millis(), 500);
        assert_eq!("1s".parse::<Period>().unwrap().as_millis(), 1_000);
        assert_eq!("1.5s".parse::<Period>().unwrap().as_millis(), 1_500);
        assert_eq!("2m".parse::<Period>().unwrap().as_millis(), 120_000);
        assert_eq!("1h".parse::<Period>().unwrap().as_millis(), 3_600_000);
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        assert_eq!("".parse::<Period>(), Err(PeriodError::Empty));
        assert!(matches!("5".parse::<Period>(), Err(PeriodError::MissingUnit(_))));
        assert!(matches!("5d".parse::<Period>(), Err(PeriodError::UnknownUnit(_))));
        assert!(matches!("1.2.3s".parse::<Period>(), Err(PeriodError::BadNumber(_))));
        assert!(matches!("0s".parse::<Period>(), Err(PeriodError::TooShort(_))));
        assert!(matches!("25h".parse::<Period>(), Err(PeriodError::TooLong(_))));
        assert!(matches!("-1s".parse::<Period>(), Err(PeriodError::UnknownUnit(_)) | Err(PeriodError::MissingUnit(_))));
    }

    #[test]
    fn displays_canonically() {
        for (input, shown) in [("60000ms", "1m"), ("1500ms", "1500ms"), ("5s", "5s"), ("120m", "2h")] {
            assert_eq!(input.parse::<Period>().unwrap().to_string(), shown);
        }
    }
}
