package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/strata-llm/strata/coordinator"
	"github.com/strata-llm/strata/transport/trust"
)

// stderrOf is where serve prints the join line.
func stderrOf(cfg serveConfig) io.Writer {
	if cfg.Stderr != nil {
		return cfg.Stderr
	}
	return os.Stderr
}

// printJoin makes (or reloads) the default join token of a secure cluster
// and prints the exact command that adds a shard. A cluster of local
// shards only on ephemeral loopback ports has nothing to join, and an
// insecure one no token.
func printJoin(cfg serveConfig, c *coordinator.Cluster, w io.Writer) error {
	a := c.Authority()
	if a == nil || cfg.Private {
		return nil
	}
	tok, created, err := a.DefaultToken(cfg.TokenTTL, time.Now())
	if err != nil {
		return fmt.Errorf("serve: default join token: %w", err)
	}
	if cfg.TokenOut != "" {
		if err := writeSecret(cfg.TokenOut, tok.String()+"\n"); err != nil {
			return fmt.Errorf("serve: --join-token-out: %w", err)
		}
	}
	ghost, gport, _ := net.SplitHostPort(c.GossipAddr())
	_, rport, _ := net.SplitHostPort(c.GRPCAddr())
	line := "shard join --coordinator " + net.JoinHostPort(ghost, gport)
	if rport != "" && rport != "7070" {
		line += " --coordinator-grpc " + net.JoinHostPort(ghost, rport)
	}
	ttl := "no expiry"
	if cfg.TokenTTL > 0 {
		ttl = "valid " + cfg.TokenTTL.String() + " from its creation"
	}
	if !created {
		ttl = "the token of an earlier start, " + ttl
	}
	fmt.Fprintf(w, "\nTo add a shard (%s; the token is also in %s; more: coordinator token create):\n\n  %s --token %s\n\n",
		ttl, filepath.Join(a.Dir, trust.DefaultTokenFile), line, tok)
	return nil
}

// writeSecret writes s to path, 0600, through a temporary file and a
// rename so that a reader never sees half of it.
func writeSecret(path, s string) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".token-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename: a no-op
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

const tokenUsage = `usage: coordinator token <create|list|revoke> [flags]

  create [--ttl 24h]   make a join token and print it (shard join --token T)
  list                 list live tokens (IDs and expiry, never secrets)
  revoke ID            revoke the tokens whose ID starts with ID

Every command takes --data-dir (the coordinator's, default strata-data) and
works while the coordinator runs: it reads the token file at every join.
`

// token runs `coordinator token`.
func token(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, tokenUsage)
		return errors.New("token: a command is required")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("token "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data-dir", "strata-data", "the coordinator's --data-dir")
	ttl := fs.Duration("ttl", 24*time.Hour, "with create: how long the token admits shards (0: no expiry)")
	switch sub {
	case "create", "list", "revoke":
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, tokenUsage)
		return nil
	default:
		fmt.Fprint(stderr, tokenUsage)
		return fmt.Errorf("token: unknown command %q", sub)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir := filepath.Join(*dataDir, coordinator.TrustDir)
	fp, err := trust.CAFingerprint(dir)
	if err != nil {
		return fmt.Errorf("token: %w (has `coordinator serve --data-dir %s` run without --insecure?)", err, *dataDir)
	}
	ts := trust.OpenTokens(dir)
	now := time.Now()
	switch sub {
	case "create":
		if fs.NArg() > 0 {
			return fmt.Errorf("token create: unexpected argument %q", fs.Arg(0))
		}
		if *ttl < 0 {
			return fmt.Errorf("token create: --ttl must be >= 0, got %v", *ttl)
		}
		tok, info, err := ts.Create(fp, *ttl, now)
		if err != nil {
			return err
		}
		exp := "never"
		if !info.Expires.IsZero() {
			exp = info.Expires.Format(time.RFC3339)
		}
		fmt.Fprintf(stderr, "token %s, expires %s\n", info.ID, exp)
		fmt.Fprintln(stdout, tok)
	case "list":
		list, err := ts.List(now)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%-12s  %-20s  %-20s  %s\n", "ID", "CREATED", "EXPIRES", "")
		for _, t := range list {
			exp := "never"
			if !t.Expires.IsZero() {
				exp = t.Expires.Format(time.RFC3339)
			}
			def := ""
			if t.Default {
				def = "default (printed at start)"
			}
			fmt.Fprintf(stdout, "%-12s  %-20s  %-20s  %s\n", t.ID, t.Created.Format(time.RFC3339), exp, def)
		}
	case "revoke":
		if fs.NArg() != 1 {
			return errors.New("token revoke: give one token ID (see token list)")
		}
		n, err := ts.Revoke(fs.Arg(0), now)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("token revoke: no live token has an ID starting with %q", fs.Arg(0))
		}
		fmt.Fprintf(stdout, "revoked %d token(s); shards that joined with them keep their certificates\n", n)
	}
	return nil
}
