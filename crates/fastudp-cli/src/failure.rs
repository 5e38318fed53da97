//! A command's failure and its exit status.

/// A command's failure: a message and an exit status (2 for bad input and
/// unusable set-ups, 1 for a run that broke off).
#[derive(Debug)]
pub struct Failure {
    /// Exit status.
    pub code: u8,
    /// One line for people.
    pub msg: String,
}

impl Failure {
    /// Bad input or an unusable set-up: exit status 2.
    pub fn usage(msg: String) -> Self {
        Failure { code: 2, msg }
    }
}

impl From<String> for Failure {
    fn from(msg: String) -> Self {
        Failure::usage(msg)
    }
}
