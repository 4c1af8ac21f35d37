//! Exact quantities in hundredths (GB of GPU memory, CPU cores).
//!
//! Shares are summed and compared many times; floats would drift (0.1 + 0.2),
//! so every amount is an integer count of hundredths. Parsing works on the
//! number's own text, so `2.005` is refused rather than rounded.

use std::fmt;

/// One GB is 2^30 bytes, as GPU vendors count an "8 GB" card.
pub const GB_BYTES: u64 = 1 << 30;

/// An exact, non-negative amount with two decimals, stored as hundredths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount(u64);

/// Why a text is not an amount; the caller adds the field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AmountError {
    NotANumber,
    TooManyDecimals,
    TooLarge,
}

impl fmt::Display for AmountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AmountError::NotANumber => "expected a plain decimal number such as 2 or 2.5",
            AmountError::TooManyDecimals => "at most 2 decimals are accepted (e.g. 2.25)",
            AmountError::TooLarge => "the number is too large",
        })
    }
}

impl Amount {
    pub const ZERO: Amount = Amount(0);

    pub const fn from_hundredths(h: u64) -> Amount {
        Amount(h)
    }

    pub const fn whole(units: u64) -> Amount {
        Amount(units * 100)
    }

    pub const fn hundredths(self) -> u64 {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Parses a plain decimal text (`7`, `6.5`, `2.25`, `-1` is refused by the
    /// caller's sign check, so a leading `-` is kept as NotANumber here).
    pub fn parse(text: &str) -> Result<Amount, AmountError> {
        let (int_part, frac_part) = match text.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (text, None),
        };
        if int_part.is_empty() || !int_part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(AmountError::NotANumber);
        }
        let frac = match frac_part {
            None => 0,
            Some(f) if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) => {
                return Err(AmountError::NotANumber)
            }
            Some(f) => {
                // Trailing zeros carry no precision: 2.500 is 2.5.
                let significant = f.trim_end_matches('0');
                if significant.len() > 2 {
                    return Err(AmountError::TooManyDecimals);
                }
                let padded = format!("{significant:0<2}");
                padded.parse::<u64>().map_err(|_| AmountError::NotANumber)?
            }
        };
        let int: u64 = int_part.parse().map_err(|_| AmountError::TooLarge)?;
        int.checked_mul(100)
            .and_then(|h| h.checked_add(frac))
            .map(Amount)
            .ok_or(AmountError::TooLarge)
    }

    /// GB from a byte count, rounded down: never promise memory that is not there.
    /// The amount as bytes (GB = 2^30 bytes).
    pub fn bytes(self) -> u64 {
        (self.0 as u128 * GB_BYTES as u128 / 100) as u64
    }

    pub fn gb_from_bytes_floor(bytes: u64) -> Amount {
        Amount(((bytes as u128 * 100) / GB_BYTES as u128) as u64)
    }

    /// GB from a byte count, rounded up: memory held outside is never understated.
    pub fn gb_from_bytes_ceil(bytes: u64) -> Amount {
        Amount(((bytes as u128 * 100).div_ceil(GB_BYTES as u128)) as u64)
    }

    pub fn checked_add(self, other: Amount) -> Option<Amount> {
        self.0.checked_add(other.0).map(Amount)
    }

    pub fn saturating_sub(self, other: Amount) -> Amount {
        Amount(self.0.saturating_sub(other.0))
    }

    /// For D-Bus properties typed `d`: exact for every value we produce
    /// (hundredths up to 2^53), and only used for display to clients.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / 100.0
    }
}

impl std::ops::Add for Amount {
    type Output = Amount;
    fn add(self, other: Amount) -> Amount {
        Amount(self.0.saturating_add(other.0))
    }
}

impl std::iter::Sum for Amount {
    fn sum<I: Iterator<Item = Amount>>(iter: I) -> Amount {
        iter.fold(Amount::ZERO, |a, b| a + b)
    }
}

/// Canonical form: shortest decimal, at most 2 places, trailing zeros dropped.
impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (int, frac) = (self.0 / 100, self.0 % 100);
        match frac {
            0 => write!(f, "{int}"),
            x if x % 10 == 0 => write!(f, "{int}.{}", x / 10),
            x => write!(f, "{int}.{x:02}"),
        }
    }
}

impl serde::Serialize for Amount {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Canonical text as a JSON number (arbitrary_precision keeps it exact).
        let n: serde_json::Number = self
            .to_string()
            .parse()
            .map_err(serde::ser::Error::custom)?;
        n.serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn canonical_forms() {
        assert_eq!(Amount::parse("7").unwrap().to_string(), "7");
        assert_eq!(Amount::parse("6.5").unwrap().to_string(), "6.5");
        assert_eq!(Amount::parse("6.50").unwrap().to_string(), "6.5");
        assert_eq!(Amount::parse("2.25").unwrap().to_string(), "2.25");
        assert_eq!(Amount::parse("0.05").unwrap().to_string(), "0.05");
        assert_eq!(
            Amount::parse("2.500").unwrap(),
            Amount::from_hundredths(250)
        );
    }

    #[test]
    fn refuses_what_is_not_exact() {
        assert_eq!(Amount::parse("2.005"), Err(AmountError::TooManyDecimals));
        assert_eq!(Amount::parse("2.001"), Err(AmountError::TooManyDecimals));
        assert_eq!(Amount::parse("1e3"), Err(AmountError::NotANumber));
        assert_eq!(Amount::parse("-1"), Err(AmountError::NotANumber));
        assert_eq!(Amount::parse(".5"), Err(AmountError::NotANumber));
        assert_eq!(Amount::parse("5."), Err(AmountError::NotANumber));
        assert_eq!(
            Amount::parse("99999999999999999999"),
            Err(AmountError::TooLarge)
        );
    }

    #[test]
    fn bytes_round_toward_safety() {
        // 8 GiB exactly is 8; one byte short is just under 8 when rounding down.
        assert_eq!(Amount::gb_from_bytes_floor(8 * GB_BYTES).to_string(), "8");
        assert_eq!(
            Amount::gb_from_bytes_floor(8 * GB_BYTES - 1).to_string(),
            "7.99"
        );
        assert_eq!(Amount::gb_from_bytes_ceil(1).to_string(), "0.01");
        assert_eq!(Amount::gb_from_bytes_ceil(GB_BYTES).to_string(), "1");
    }

    proptest! {
        #[test]
        fn display_then_parse_round_trips(h in 0u64..10_000_000) {
            let a = Amount::from_hundredths(h);
            prop_assert_eq!(Amount::parse(&a.to_string()).unwrap(), a);
        }
    }
}
