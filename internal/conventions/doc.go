// Package conventions holds tests that turn the project's conventions into
// failures: every package says what it is for.
package conventions
