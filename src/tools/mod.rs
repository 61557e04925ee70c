//! The command line (`cli`) and the tools it runs: `push` (files to a
//! server), `bench` (the engine's throughput), `loadgen` (HTTP load),
//! `generate` (the synthetic ghost-kitchen feed) and `soak` (a long run sampled).

pub mod bench;
pub mod bench_long;
pub mod cli;
pub mod generate;
pub mod loadgen;
pub mod measure;
pub mod push;
pub mod serve_child;
pub mod soak;
