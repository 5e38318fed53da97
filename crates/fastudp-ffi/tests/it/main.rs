//! The C ABI's integration tests: one test binary, `it`, with the C side
//! (`c`) and the header drift check (`header`).

mod c;
mod header;
