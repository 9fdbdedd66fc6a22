//! `numeric` values: PostgreSQL's text form and its binary COPY form.

use std::fmt::Write as _;

/// An exact `numeric`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Numeric {
    /// The decimal text exactly as PostgreSQL printed it, e.g. `-12.3400`.
    Finite(String),
    NaN,
    Infinity,
    NegInfinity,
}

/// A `numeric` in its binary send format: the digit count, the weight
/// (power of 10000) of the first digit, the sign, the display scale, then
/// the base-10000 digits, each an int16 (`numeric_send` in PostgreSQL's
/// `src/backend/utils/adt/numeric.c`).
pub(crate) struct BinaryNumeric<'a> {
    weight: i16,
    sign: u16,
    dscale: u16,
    digits: &'a [u8],
}

impl<'a> BinaryNumeric<'a> {
    const POSITIVE: u16 = 0x0000;
    const NEGATIVE: u16 = 0x4000;
    const NAN: u16 = 0xC000;
    const INFINITY: u16 = 0xD000;
    const NEG_INFINITY: u16 = 0xF000;

    /// `None` when the bytes are not a well-formed numeric.
    pub(crate) fn parse(bytes: &'a [u8]) -> Option<BinaryNumeric<'a>> {
        let word = |i: usize| Some(u16::from_be_bytes([*bytes.get(i)?, *bytes.get(i + 1)?]));
        let ndigits = usize::from(word(0)?);
        let n = BinaryNumeric {
            weight: word(2)? as i16,
            sign: word(4)?,
            dscale: word(6)?,
            digits: bytes.get(8..)?,
        };
        let digits_ok = n.digits.len() == 2 * ndigits
            && n.digits
                .chunks_exact(2)
                .all(|d| u16::from_be_bytes([d[0], d[1]]) < 10_000);
        let sign_ok = matches!(
            n.sign,
            Self::POSITIVE | Self::NEGATIVE | Self::NAN | Self::INFINITY | Self::NEG_INFINITY
        );
        (digits_ok && sign_ok && n.dscale <= 0x3FFF).then_some(n)
    }

    /// The digit at `i` (weight `weight - i`); 0 outside the digits held.
    fn digit(&self, i: i32) -> u16 {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.digits.get(2 * i..2 * i + 2))
            .map_or(0, |d| u16::from_be_bytes([d[0], d[1]]))
    }

    /// The value, its text as `numeric_out` prints it.
    pub(crate) fn numeric(&self) -> Numeric {
        match self.sign {
            Self::NAN => return Numeric::NaN,
            Self::INFINITY => return Numeric::Infinity,
            Self::NEG_INFINITY => return Numeric::NegInfinity,
            _ => {}
        }
        let mut text = String::new();
        if self.sign == Self::NEGATIVE {
            text.push('-');
        }
        let weight = i32::from(self.weight);
        if weight < 0 {
            text.push('0');
        }
        for i in 0..=weight {
            let d = self.digit(i);
            if i == 0 {
                let _ = write!(text, "{d}");
            } else {
                let _ = write!(text, "{d:04}");
            }
        }
        let dscale = usize::from(self.dscale);
        if dscale > 0 {
            text.push('.');
            let start = text.len();
            let mut i = weight + 1;
            while text.len() - start < dscale {
                let _ = write!(text, "{:04}", self.digit(i));
                i += 1;
            }
            text.truncate(start + dscale);
        }
        Numeric::Finite(text)
    }

    /// The value as an unscaled integer at `scale`, when it is finite and
    /// holds no more fractional digits than `scale` and no more digits
    /// than `precision`.
    pub(crate) fn unscaled(&self, scale: u32, precision: u32) -> Option<i128> {
        if !matches!(self.sign, Self::POSITIVE | Self::NEGATIVE) {
            return None;
        }
        let weight = i32::from(self.weight);
        let scale = i32::try_from(scale).ok()?;
        let mut unscaled: i128 = 0;
        for i in 0..(self.digits.len() / 2) as i32 {
            let d = i128::from(self.digit(i));
            let exponent = 4 * (weight - i) + scale;
            if exponent >= 0 {
                let power = 10i128.checked_pow(u32::try_from(exponent).ok()?)?;
                unscaled = unscaled.checked_add(d.checked_mul(power)?)?;
            } else {
                // Digits below the scale must be zeros.
                let power = 10i128
                    .checked_pow(exponent.unsigned_abs())
                    .unwrap_or(i128::MAX);
                if d % power != 0 {
                    return None;
                }
                unscaled = unscaled.checked_add(d / power)?;
            }
        }
        if unscaled >= 10i128.checked_pow(precision)? {
            return None;
        }
        Some(if self.sign == Self::NEGATIVE {
            -unscaled
        } else {
            unscaled
        })
    }
}

pub(super) fn parse_numeric(text: &str) -> Option<Numeric> {
    match text {
        "NaN" => return Some(Numeric::NaN),
        "Infinity" => return Some(Numeric::Infinity),
        "-Infinity" => return Some(Numeric::NegInfinity),
        _ => {}
    }
    let digits = text.strip_prefix('-').unwrap_or(text);
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !all_digits(whole) || !all_digits(frac) || digits.ends_with('.') {
        return None;
    }
    Some(Numeric::Finite(text.to_owned()))
}
