//! Reads retry delays such as "250ms", "30s", "5m", "2h", "1d", "1h30m".

/// The delay in milliseconds, or a message saying what is wrong.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".to_owned());
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("expected a number at {rest:?}"));
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after.chars().take_while(char::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(unit_len);
        let scale: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(format!("{number:?} has no unit: use ms, s, m, h or d")),
            other => return Err(format!("unknown unit {other:?}: use ms, s, m, h or d")),
        };
        let number: u64 = number
            .parse()
            .map_err(|_| format!("{number:?} is too large"))?;
        total = number
            .checked_mul(scale)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| format!("{text:?} is too long"))?;
        rest = after;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn reads_units_and_combinations() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("5m"), Ok(300_000));
        assert_eq!(parse_millis("1h30m"), Ok(5_400_000));
        assert_eq!(parse_millis("1d"), Ok(86_400_000));
        assert_eq!(parse_millis("0s"), Ok(0));
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(parse_millis("").is_err());
        assert!(parse_millis("5").unwrap_err().contains("no unit"));
        assert!(parse_millis("5 weeks").is_err());
        assert!(parse_millis("3y").unwrap_err().contains("unknown unit"));
        assert!(parse_millis("99999999999999999999d").is_err());
    }
}
