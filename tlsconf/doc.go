// Package tlsconf builds the TLS server config of every listener with
// [listeners.tls], and keeps it current for the generation's life without
// ever replacing it: workers hold the *tls.Config pointer, and what changes
// underneath is read through it.
//
//   - Certificates: chosen per handshake in GetCertificate from an immutable
//     set behind an atomic pointer (SNI exact names, then "*.example.com"
//     wildcards, then the first pair, the default). When a certificate or
//     key file changes on disk (inotify on the files' directories, or a poll
//     where inotify is unavailable), on SIGUSR2 and on POST /tls/reload
//     (Set.Reload), the changed pairs are loaded, checked and swapped in as
//     a new set; a pair that does not load is refused and the old one keeps
//     serving.
//   - Session-ticket keys (TLS 1.2 tickets and TLS 1.3 resumption both use
//     them): generated per listener, or read from session_ticket_keys_file;
//     every session_ticket_rotation a new key encrypts and the previous two
//     still decrypt. Set.TicketKeys and Set.InstallTicketKeys carry them
//     across a hot restart, with the key the next rotation switches to
//     (TicketKeyRing), so that a client's ticket from one generation
//     resumes on the next.
//
// Build loads and checks everything and starts nothing (hotproxy validate
// stops there); Start attaches the stats and runs the one goroutine that
// owns the watching, the reloads and the rotations; Close stops it.
package tlsconf
