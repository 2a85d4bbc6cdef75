package h2

// writeBuf collects encoded frames until the connection's writer takes them
// all for one write system call. It is an io.Writer for an http2.Framer.
// Side-neutral: both ends of a connection coalesce frames the same way.
// Not safe for concurrent use: the connection's write lock guards it.
type writeBuf struct {
	pending []byte // frames queued, not yet handed to the writer
	spare   []byte // the buffer the writer returned, reused next
}

func (b *writeBuf) Write(p []byte) (int, error) {
	b.pending = append(b.pending, p...)
	return len(p), nil
}

func (b *writeBuf) len() int { return len(b.pending) }

// take hands every queued byte to the writer and starts a new batch in the
// spare buffer; the writer gives the slice back with giveBack.
func (b *writeBuf) take() []byte {
	out := b.pending
	b.pending = b.spare[:0]
	b.spare = nil
	return out
}

// giveBack returns a written batch for reuse. A batch grown huge by a burst
// is dropped so one burst does not pin its memory for the connection's life.
func (b *writeBuf) giveBack(p []byte) {
	if cap(p) > maxRetainedWriteBuf {
		return
	}
	b.spare = p[:0]
}

const maxRetainedWriteBuf = 256 << 10
