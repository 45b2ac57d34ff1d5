package mcpgate

import (
	"bufio"
	"bytes"
	"io"
)

// liftReader lifts params.idempotencyKey in the newline-delimited JSON
// messages a stdio client sends.
type liftReader struct {
	src io.ReadCloser
	br  *bufio.Reader
	buf []byte
	err error
}

func newLiftReader(src io.ReadCloser) *liftReader {
	return &liftReader{src: src, br: bufio.NewReaderSize(src, 64<<10)}
}

func (r *liftReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		line, err := r.br.ReadBytes('\n')
		r.err = err
		if mayNameParamsKey(line) {
			nl := bytes.HasSuffix(line, []byte("\n"))
			line = liftBody(bytes.TrimRight(line, "\r\n"))
			if nl {
				line = append(line, '\n')
			}
		}
		r.buf = line
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *liftReader) Close() error { return r.src.Close() }
