package shard

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// store is the shard's persistent state in bbolt: only its node identity
// (DESIGN.md "Persistence"). Each method is one transaction.
type store struct {
	db *bolt.DB
}

var (
	bucketNode = []byte("node")
	keyNodeID  = []byte("id")
)

// openStore opens (creating) dir/shard.db. It fails at once, rather than
// waiting, when another process holds the database.
func openStore(dir string) (*store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	path := filepath.Join(dir, "shard.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("open %s: another shard process holds it", path)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return &store{db: db}, nil
}

// NodeID returns the persisted node ID, creating a random one (16 bytes,
// hex) on first use.
func (s *store) NodeID() (string, error) {
	var id string
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketNode)
		if err != nil {
			return err
		}
		if v := b.Get(keyNodeID); len(v) > 0 {
			id = string(v)
			return nil
		}
		var raw [16]byte
		_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails
		id = hex.EncodeToString(raw[:])
		return b.Put(keyNodeID, []byte(id))
	})
	if err != nil {
		return "", fmt.Errorf("node ID: %w", err)
	}
	return id, nil
}

// Close closes the database.
func (s *store) Close() error { return s.db.Close() }
