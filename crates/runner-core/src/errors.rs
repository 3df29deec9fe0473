//! An error as one line with its causes, for messages and logs that must say
//! *why*: libraries' top-level messages ("error sending request for url …",
//! "could not write the bundle") hide the cause an operator can act on.

/// `error` followed by each of its sources, joined with `": "`.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("could not start")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_is_named_in_order() {
        let err = Outer(std::io::Error::other("disk full"));
        assert_eq!(error_chain(&err), "could not start: disk full");
    }
}
