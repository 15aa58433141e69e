//! A JSON payload given on the command line (`tasks submit`, `events
//! emit`): the argument itself, standard input (`-`) or a file (`@FILE`),
//! checked to be JSON whose numbers survive the trip. The payload travels
//! as a `serde_json::Value`, whose numbers are 64-bit integers or doubles:
//! a number beyond them (a 23-digit integer, a decimal of 20 significant
//! digits) would be stored rounded, so it is refused, with the way out.

use crate::failure::Failure;

/// The most payload either command reads.
pub(crate) const MAX_PAYLOAD_BYTES: u64 = 16 * 1024 * 1024;

/// The payload's text and its value.
pub(crate) fn json(arg: &str) -> Result<(String, serde_json::Value), Failure> {
    let text = read(arg)?;
    let value = serde_json::from_str(&text)
        .map_err(|e| Failure::config(format!("the payload is not valid JSON: {e}")))?;
    if let Some(number) = inexact_number(&text) {
        return Err(Failure::config(format!(
            "the payload's number {number} would be stored rounded (the command line carries \
             64-bit integers and doubles): write it as a string, or emit or submit from SQL \
             (outbox_emit, outbox_submit), which keep numbers exactly"
        )));
    }
    Ok((text, value))
}

/// The argument itself, or what `-` or `@FILE` names, refusing anything
/// larger than [`MAX_PAYLOAD_BYTES`].
fn read(arg: &str) -> Result<String, Failure> {
    use std::io::Read;
    let (source, reader): (String, Box<dyn Read>) = if arg == "-" {
        ("standard input".to_owned(), Box::new(std::io::stdin()))
    } else if let Some(path) = arg.strip_prefix('@') {
        let file = std::fs::File::open(path)
            .map_err(|e| Failure::config(format!("cannot read the payload file {path:?}: {e}")))?;
        (format!("file {path:?}"), Box::new(file))
    } else {
        return check_size(arg.len() as u64, "the payload argument").map(|()| arg.to_owned());
    };
    let mut bytes = Vec::new();
    reader
        .take(MAX_PAYLOAD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::config(format!("cannot read the payload from {source}: {e}")))?;
    check_size(bytes.len() as u64, &source)?;
    String::from_utf8(bytes)
        .map_err(|e| Failure::config(format!("the payload from {source} is not UTF-8: {e}")))
}

fn check_size(len: u64, source: &str) -> Result<(), Failure> {
    if len > MAX_PAYLOAD_BYTES {
        return Err(Failure::config(format!(
            "the payload from {source} is larger than the {} MiB the command line accepts",
            MAX_PAYLOAD_BYTES / (1024 * 1024)
        )));
    }
    Ok(())
}

/// The first number literal of valid JSON `text` whose value a
/// `serde_json::Value` cannot hold exactly, if any.
fn inexact_number(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let (mut i, mut in_string) = (0, false);
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
        } else if b == b'"' {
            in_string = true;
            i += 1;
        } else if b == b'-' || b.is_ascii_digit() {
            let start = i;
            while i < bytes.len()
                && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
            {
                i += 1;
            }
            let literal = &text[start..i];
            if !exact(literal) {
                return Some(literal);
            }
        } else {
            i += 1;
        }
    }
    None
}

/// Whether serde_json keeps number `literal`'s value: it is read by the
/// same parser as the payload, and must print back to the same decimal
/// (what PostgreSQL then stores).
fn exact(literal: &str) -> bool {
    match serde_json::from_str::<serde_json::Number>(literal) {
        Ok(number) => decimal(literal) == decimal(&number.to_string()),
        Err(_) => false,
    }
}

/// A decimal literal as (negative, significant digits, exponent of the
/// last digit), zeros trimmed: equal for equal values.
fn decimal(literal: &str) -> (bool, String, i64) {
    let (negative, rest) = match literal.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, literal),
    };
    let (mantissa, exponent) = match rest.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i64>().unwrap_or(0)),
        None => (rest, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits = format!("{whole}{fraction}");
    let mut exponent = exponent - fraction.len() as i64;
    while digits.ends_with('0') {
        digits.pop();
        exponent += 1;
    }
    let digits = digits.trim_start_matches('0').to_owned();
    if digits.is_empty() {
        return (false, String::new(), 0);
    }
    (negative, digits, exponent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_a_value_cannot_hold_are_found_and_the_rest_pass() {
        for ok in [
            r#"{"a": 1, "b": -9223372036854775808, "c": 18446744073709551615}"#,
            r#"{"a": 1.5, "b": 1.50, "c": 0.1, "d": 1e300, "e": -0.0, "f": 2.5E-3}"#,
            // Seventeen digits, read to the nearest double (float_roundtrip).
            r#"{"a": 404288093852.35596, "b": 0.00021659939713061338, "c": 1859062658947177.0}"#,
            r#"[-0, 1.0, 1e2, 1e20, -1e-7]"#,
            r#"{"s": "12345678901234567890123", "t": "1.0000000000000000000001"}"#,
            r#"["a \" 99999999999999999999999", 3]"#,
            "1.7976931348623157e308",
        ] {
            assert_eq!(inexact_number(ok), None, "{ok}");
        }
        for (bad, number) in [
            (
                r#"{"big": 12345678901234567890123, "a": 1}"#,
                "12345678901234567890123",
            ),
            (r#"{"a": 18446744073709551616}"#, "18446744073709551616"),
            (
                r#"{"a": [1, 0.12345678901234567891]}"#,
                "0.12345678901234567891",
            ),
            (r#"{"a": -99999999999999999999}"#, "-99999999999999999999"),
        ] {
            assert_eq!(inexact_number(bad), Some(number), "{bad}");
        }
    }
}
