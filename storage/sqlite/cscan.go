//go:build cgo && !modernc

package sqlite

/*
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

// The SQLite library linked into this binary (compiled by the driver
// package); only its stable C API is used here.
typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
typedef struct sqlite3_value sqlite3_value;
int sqlite3_open_v2(const char *filename, sqlite3 **db, int flags, const char *vfs);
int sqlite3_close_v2(sqlite3 *db);
int sqlite3_busy_timeout(sqlite3 *db, int ms);
int sqlite3_exec(sqlite3 *db, const char *sql, void *cb, void *arg, char **errmsg);
int sqlite3_prepare_v2(sqlite3 *db, const char *sql, int n, sqlite3_stmt **st, const char **tail);
int sqlite3_bind_int64(sqlite3_stmt *st, int i, int64_t v);
int sqlite3_step(sqlite3_stmt *st);
int sqlite3_finalize(sqlite3_stmt *st);
sqlite3_value *sqlite3_column_value(sqlite3_stmt *st, int i);
int sqlite3_value_type(sqlite3_value *v);
int64_t sqlite3_value_int64(sqlite3_value *v);
const unsigned char *sqlite3_value_text(sqlite3_value *v);
const void *sqlite3_value_blob(sqlite3_value *v);
int sqlite3_value_bytes(sqlite3_value *v);
const char *sqlite3_errmsg(sqlite3 *db);
int sqlite3_extended_errcode(sqlite3 *db);

#define EL_ROW 100
#define EL_DONE 101
#define EL_INTEGER 1
#define EL_TEXT 3
#define EL_BLOB 4

// Column kinds of a scanned SELECT.
enum { K_INT = 0, K_BOOL = 1, K_TEXT = 2, K_HASH = 3 };

// el_shape says how to read a row: the kind of each column, and how
// many columns of each sort there are (integers and booleans count as
// integers). At most 16 of each.
typedef struct {
	const unsigned char *kinds;
	int ncols, nints, nstrs, nhash;
} el_shape;

// el_put writes the current row of st at buf: a record of nints unsigned
// 64-bit words (the integer columns in order) and a flag word, nstrs
// 32-bit string lengths, nhash 32-byte hashes and then the string bytes.
// It returns the record's size, or 0 if it does not fit in cap bytes. A
// value of an unexpected type or range sets the flag word: the caller
// reads that row again through the driver.
//
// Each column is read through sqlite3_column_value once, not through two
// or three sqlite3_column_* calls that each look the column up again.
// SQLite calls such a value unprotected: it may not be shared between
// threads; the scan's connection is used by one goroutine at a time.
static int el_put(sqlite3_stmt *st, const el_shape *sh, unsigned char *buf, int cap) {
	int head = (sh->nints + 1) * 8 + sh->nstrs * 4 + sh->nhash * 32;
	if (cap < head) return 0;
	uint64_t ints[16];
	uint32_t lens[16];
	const unsigned char *strs[16];
	uint64_t bad = 0;
	int ni = 0, ns = 0, nh = 0, total = head;
	unsigned char *hashes = buf + (sh->nints + 1) * 8 + sh->nstrs * 4;
	for (int i = 0; i < sh->ncols; i++) {
		sqlite3_value *val = sqlite3_column_value(st, i);
		int t = sqlite3_value_type(val);
		switch (sh->kinds[i]) {
		case K_INT:
		case K_BOOL: {
			int64_t v = 0;
			if (t == EL_INTEGER) {
				v = sqlite3_value_int64(val);
				if (v < 0 || (sh->kinds[i] == K_BOOL && v > 1)) bad = 1;
			} else {
				bad = 1;
			}
			ints[ni++] = (uint64_t)v;
			break;
		}
		case K_TEXT: {
			const unsigned char *p = 0;
			int n = 0;
			if (t == EL_TEXT) {
				p = sqlite3_value_text(val);
				n = sqlite3_value_bytes(val);
			} else {
				bad = 1;
			}
			strs[ns] = p;
			lens[ns] = (uint32_t)n;
			total += n;
			ns++;
			break;
		}
		case K_HASH: {
			unsigned char *dst = hashes + 32 * nh;
			if (t == EL_BLOB && sqlite3_value_bytes(val) == 32) {
				memcpy(dst, sqlite3_value_blob(val), 32);
			} else {
				memset(dst, 0, 32);
				bad = 1;
			}
			nh++;
			break;
		}
		}
	}
	if (total > cap) return 0;
	memcpy(buf, ints, 8 * sh->nints);
	memcpy(buf + 8 * sh->nints, &bad, 8);
	memcpy(buf + 8 * (sh->nints + 1), lens, 4 * sh->nstrs);
	unsigned char *out = buf + head;
	for (int i = 0; i < sh->nstrs; i++) {
		if (lens[i]) memcpy(out, strs[i], lens[i]);
		out += lens[i];
	}
	return total;
}

// el_fill steps st and writes records to buf until it is full or the
// rows end. *pending says that st holds a row not yet written (it did not
// fit last time). It returns the number of records and sets *used and
// *rc (EL_ROW: more rows may follow; EL_DONE: the end; else an error).
static int el_fill(sqlite3_stmt *st, const unsigned char *kinds, int ncols, int nints, int nstrs, int nhash,
		unsigned char *buf, int cap, int *pending, int *used, int *rc) {
	el_shape sh = {kinds, ncols, nints, nstrs, nhash};
	int n = 0, off = 0;
	for (;;) {
		if (!*pending) {
			int r = sqlite3_step(st);
			if (r != EL_ROW) {
				*rc = r;
				*used = off;
				return n;
			}
			*pending = 1;
		}
		int size = el_put(st, &sh, buf + off, cap - off);
		if (size == 0) {
			*rc = EL_ROW;
			*used = off;
			return n;
		}
		*pending = 0;
		off += size;
		n++;
	}
}
*/
import "C"

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/mattn/go-sqlite3"

	"github.com/effect-ledger/effect-ledger/chain"
)

// The verifier's scans step SQLite from C and copy a batch of rows per
// call into a Go buffer: reading the 23 columns through the driver costs
// a cgo call and an allocation per value, and packing them into one text
// value in SQL (the earlier design) costs SQLite more than reading the
// row. The scan opens a read-only connection of its own on the file.

// rowBatch is the buffer size of one el_fill call.
const rowBatch = 256 << 10

// cScan is a prepared scan on its own read-only connection.
type cScan struct {
	db *C.sqlite3
	st *C.sqlite3_stmt
}

// sqliteErr is the connection's last error.
func sqliteErr(db *C.sqlite3, what string) error {
	ext := int(C.sqlite3_extended_errcode(db))
	return classify(fmt.Errorf("%s: %s: %w", what, C.GoString(C.sqlite3_errmsg(db)),
		sqlite3.Error{Code: sqlite3.ErrNo(ext & 0xff), ExtendedCode: sqlite3.ErrNoExtended(ext)}))
}

// openCScan opens path read-only and prepares query (its columns
// are receiptColumns) with args bound in order. cacheKiB sizes the
// connection's page cache.
func openCScan(path string, busy time.Duration, cacheKiB int, query string, args ...uint64) (*cScan, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var db *C.sqlite3
	// SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX: one goroutine uses it.
	if rc := C.sqlite3_open_v2(cpath, &db, 0x1|0x8000, nil); rc != 0 {
		err := fmt.Errorf("open %s: result code %d", path, int(rc))
		if db != nil {
			err = sqliteErr(db, "open "+path)
			C.sqlite3_close_v2(db)
		}
		return nil, err
	}
	s := &cScan{db: db}
	C.sqlite3_busy_timeout(db, C.int(busy.Milliseconds()))
	pragma := C.CString(fmt.Sprintf("PRAGMA cache_size = -%d; PRAGMA query_only = 1;", cacheKiB))
	defer C.free(unsafe.Pointer(pragma))
	if C.sqlite3_exec(db, pragma, nil, nil, nil) != 0 {
		err := sqliteErr(db, "scan pragmas")
		s.close()
		return nil, err
	}
	cq := C.CString(query)
	defer C.free(unsafe.Pointer(cq))
	if C.sqlite3_prepare_v2(db, cq, -1, &s.st, nil) != 0 {
		err := sqliteErr(db, "prepare scan")
		s.close()
		return nil, err
	}
	for i, a := range args {
		if C.sqlite3_bind_int64(s.st, C.int(i+1), C.int64_t(int64(a))) != 0 {
			err := sqliteErr(db, "bind scan")
			s.close()
			return nil, err
		}
	}
	return s, nil
}

func (s *cScan) close() {
	if s.st != nil {
		C.sqlite3_finalize(s.st)
		s.st = nil
	}
	if s.db != nil {
		C.sqlite3_close_v2(s.db)
		s.db = nil
	}
}

// each calls fn for every receipt of the scan, whose columns are
// receiptColumns. A row whose values do not fit the receipt format is
// read again by reread (column by column). fn must not retain the
// pointer.
func (s *cScan) each(ctx context.Context, reread func(seq uint64, r *chain.Receipt) error, fn func(*chain.Receipt) error) error {
	var r chain.Receipt
	return s.records(ctx, &receiptShape, func(rec []byte) (int, error) {
		size, err := decodeRow(&r, rec)
		if err != nil {
			return 0, err
		}
		if r.Malformed != nil {
			if err := reread(r.Seq, &r); err != nil {
				return 0, fmt.Errorf("receipt %d: %w", r.Seq, err)
			}
		}
		return size, fn(&r)
	})
}

// records calls fn for every record of the scan; fn returns the record's
// size.
//
// SQLite steps the rows on a goroutine of its own, a batch ahead of the
// decoding and fn: the two halves of the work run on two cores.
func (s *cScan) records(ctx context.Context, sh *shape, fn func(rec []byte) (int, error)) error {
	type batch struct {
		buf []byte
		n   int
		err error
	}
	const inFlight = 3
	free := make(chan []byte, inFlight)
	for range inFlight {
		free <- make([]byte, rowBatch)
	}
	full := make(chan batch, inFlight)
	stop := make(chan struct{})
	done := make(chan struct{})
	kinds := C.CBytes(sh.kinds)
	go func() {
		defer close(done)
		defer close(full)
		var pending, used, rc C.int
		for {
			var buf []byte
			select {
			case buf = <-free:
			case <-stop:
				return
			}
			n := C.el_fill(s.st, (*C.uchar)(kinds), C.int(len(sh.kinds)), C.int(sh.nInts), C.int(sh.nStrs), C.int(sh.nHash),
				(*C.uchar)(unsafe.Pointer(&buf[0])), C.int(len(buf)), &pending, &used, &rc)
			b := batch{buf: buf[:used], n: int(n)}
			switch {
			case rc != 100 && rc != 101: // SQLITE_ROW, SQLITE_DONE
				b.err = sqliteErr(s.db, "scan")
			case n == 0 && rc == 100: // one row larger than the buffer
				free <- make([]byte, 2*len(buf))
				continue
			}
			select {
			case full <- b:
			case <-stop:
				return
			}
			if rc != 100 {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		<-done // the connection is closed only after the stepping ends
		C.free(kinds)
	}()
	for b := range full {
		if err := ctx.Err(); err != nil {
			return err
		}
		rest := b.buf
		for range b.n {
			size, err := fn(rest)
			if err != nil {
				return err
			}
			rest = rest[size:]
		}
		if b.err != nil {
			return b.err
		}
		free <- b.buf[:cap(b.buf)]
	}
	return nil
}
