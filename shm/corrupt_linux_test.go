package shm

import (
	"encoding/binary"
	"os"
	"strings"
	"testing"
)

// TestAttachCorruptNameRecord: a name record whose offset or length points
// outside the string table makes Open (the writer's attach) and the reader
// fail with an error naming the file and the record, not panic with
// "slice bounds out of range" as the writer's name lookup did.
func TestAttachCorruptNameRecord(t *testing.T) {
	for _, c := range []struct {
		name  string
		field uint64
		value uint64
	}{
		{"offset", rNameOff, 1 << 40},
		{"length", rNameLen, 1 << 62},
		{"length-past-used", rNameLen, 4000},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := smallOptions(t)
			r := openRegion(t, o)
			if _, err := r.Alloc("listener.web.downstream_cx_total", KindCounter, 0); err != nil {
				t.Fatal(err)
			}
			g := r.g
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(o.Path)
			if err != nil {
				t.Fatal(err)
			}
			binary.LittleEndian.PutUint64(data[g.record(0)+c.field:], c.value)
			if err := os.WriteFile(o.Path, data, 0o600); err != nil {
				t.Fatal(err)
			}

			// Startup: attach, then look the stats up by name.
			r2, err := Open(o)
			if err == nil {
				defer r2.Close()
				_, err = r2.Alloc("listener.web.downstream_cx_total", KindCounter, 0)
			}
			if err == nil || !strings.Contains(err.Error(), o.Path) || !strings.Contains(err.Error(), "record 0 name") {
				t.Fatalf("Open of a region with a corrupt name record: %v", err)
			}
			t.Log(err)
			rd, err := OpenReader(o.Path)
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Close()
			if _, err := rd.Snapshot(); err == nil || !strings.Contains(err.Error(), o.Path) {
				t.Fatalf("reader of a region with a corrupt name record: %v", err)
			}
			after, _ := os.ReadFile(o.Path)
			if string(after) != string(data) {
				t.Fatal("a refused region was modified")
			}
		})
	}
}

// TestAttachCorruptTables: bad owner entries, counts and value offsets are
// refused at attach with an error naming the file.
func TestAttachCorruptTables(t *testing.T) {
	o := smallOptions(t)
	r := openRegion(t, o)
	if _, err := r.Alloc("c", KindCounter, 0); err != nil {
		t.Fatal(err)
	}
	g := r.g
	r.Close()
	valid, err := os.ReadFile(o.Path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		off  uint64
		v    uint64
		want string
	}{
		{"owner-state", g.owner(1) + oState, 9, "owner 1 has unknown state"},
		{"owner-lanes", g.owner(1) + oLanes, 1 << 40, "owner 1 has"},
		{"owner-journal", g.owner(1) + oFoldJournal, 1 << 30, "fold journal"},
		{"record-count", hNRecords, 1 << 30, "record count"},
		{"strings-used", hStringsUsed, 1 << 50, "string table use"},
		{"values-used", hValuesUsed, 12, "value heap use"},
		{"value-offset", g.record(0) + rValueOff, 1 << 40, "record 0 (counter) value"},
		{"kind", g.record(0) + rKind, 77, "unknown kind"},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := append([]byte(nil), valid...)
			if c.name == "kind" {
				data[c.off] = byte(c.v)
			} else {
				if strings.HasPrefix(c.name, "owner-") {
					binary.LittleEndian.PutUint64(data[g.owner(1)+oState:], uint64(OwnerLive))
				}
				binary.LittleEndian.PutUint64(data[c.off:], c.v)
			}
			if err := os.WriteFile(o.Path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Open(o)
			if err == nil || !strings.Contains(err.Error(), o.Path) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open: %v (want %q)", err, c.want)
			}
		})
	}
}
