//! snowlease
