//! `#[outbox_task]`: declares a payload struct as an outbox task type.
//!
//! Use it through the `outbox` crate (`outbox::outbox_task`); the code it
//! generates refers only to `::outbox`'s hidden re-exports, so users never
//! depend on this crate or on `inventory` themselves.
//!
//! This crate is thin on purpose: `parse` reads and checks the options,
//! `duration` reads retry delays, `expand` writes the code.

mod duration;
mod expand;
mod parse;

use proc_macro::TokenStream;

/// Declares a payload struct as an outbox task type and registers it.
///
/// ```ignore
/// use outbox::{Task, outbox_task};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// #[outbox_task(task_type = "report.generate", queue = "reports", priority = 3,
///               retry_delays = ["30s", "5m", "1h"])]
/// struct GenerateReport { month: u32 }
///
/// assert_eq!(GenerateReport::QUEUE, "reports");
/// assert_eq!(GenerateReport::RETRY_DELAYS.len(), 3); // three attempts
/// ```
///
/// (This crate cannot compile the example: it would need the engine as a
/// dev-dependency. `outbox-core/tests/task_attribute.rs` runs it verbatim.)
///
/// Options: `task_type` (required, unique in the binary), `queue` (default
/// `"default"`), `priority` (0 first to 9 last; default 0), `retry_delays`
/// (the delay after each failure, as `"250ms"`, `"30s"`, `"5m"`, `"2h"`,
/// `"1d"` or combinations such as `"1h30m"`; the list's length is the
/// maximum number of attempts; default 1m, 5m, 15m, 30m, 1h, 2h, 4h, 8h,
/// 12h, 1d).
#[proc_macro_attribute]
pub fn outbox_task(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    match parse::parse(args.into(), item.clone()) {
        Ok(task) => expand::expand(&task, &item).into(),
        Err(error) => {
            // One mistake, one error: report it and still emit the user's
            // item so that code using it does not fail to resolve too.
            let error = error.to_compile_error();
            quote::quote!(#error #item).into()
        }
    }
}
