package pgtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestURL(t *testing.T) {
	ctx := context.Background()
	a, b := pgtest.URL(t), pgtest.URL(t)
	if a == b {
		t.Fatalf("two tests got the same database %s", a)
	}
	for _, u := range []string{a, b} {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `CREATE TABLE x (id int)`); err != nil {
			t.Errorf("fresh database %s: %v", u, err)
		}
		_ = conn.Close(ctx)
	}
}

func TestCluster_StopStart(t *testing.T) {
	ctx := context.Background()
	c := pgtest.StartCluster(t)
	u := c.URL(t)
	ping := func() error {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close(ctx) }()
		return conn.Ping(ctx)
	}
	if err := ping(); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := ping(); err == nil {
		t.Fatal("ping succeeded on a stopped cluster")
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if err := ping(); err != nil {
		t.Fatalf("after Start: %v", err)
	}
}
