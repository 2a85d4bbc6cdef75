package stats

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/hotproxy/hotproxy/shm"
)

// TimeFormat is how the exposition writes an instant: RFC 3339 with
// milliseconds, in the instant's location.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// WriteOwners writes the owner table of a region for a person: a header
// line, then one line per owner (slot, pid, epoch, state, start, how long
// before now its last heartbeat was, lanes) in aligned columns, a note if
// there is no owner, and a blank line. An instant that was never set is
// written as "-".
func WriteOwners(w io.Writer, owners []shm.Owner, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tPID\tEPOCH\tSTATE\tSTART\tHEARTBEAT\tLANES")
	for _, ow := range owners {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s\t%d\n", ow.Slot, ow.PID, ow.Epoch, ow.State,
			formatInstant(ow.Start), heartbeatAge(ow.Heartbeat, now), ow.Lanes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(owners) == 0 {
		fmt.Fprintln(w, "(no owners: no generation is attached to this region)")
	}
	_, err := fmt.Fprintln(w)
	return err
}

// WriteOwnerComments writes the owner table as Prometheus comment lines,
// "# hotproxy owner slot=N pid=N epoch=N state=S start=T heartbeat_age=D
// lanes=N", one per owner, with the fields of WriteOwners. Scrapers ignore
// comments, so they can go before the output of WritePrometheus.
func WriteOwnerComments(w io.Writer, owners []shm.Owner, now time.Time) error {
	for _, ow := range owners {
		_, err := fmt.Fprintf(w, "# hotproxy owner slot=%d pid=%d epoch=%d state=%s start=%s heartbeat_age=%s lanes=%d\n",
			ow.Slot, ow.PID, ow.Epoch, ow.State, formatInstant(ow.Start), heartbeatAge(ow.Heartbeat, now), ow.Lanes)
		if err != nil {
			return err
		}
	}
	return nil
}

// formatInstant is t in TimeFormat, "-" if t was never set (the Unix epoch
// or before).
func formatInstant(t time.Time) string {
	if t.UnixNano() <= 0 {
		return "-"
	}
	return t.Format(TimeFormat)
}

// heartbeatAge is how long before now the owner's last heartbeat was,
// rounded to the millisecond ("1.5s ago"), "-" if it never beat. A
// heartbeat after now (clocks of two processes) is "0s ago".
func heartbeatAge(hb, now time.Time) string {
	if hb.UnixNano() <= 0 {
		return "-"
	}
	age := now.Sub(hb)
	if age < 0 {
		age = 0
	}
	return age.Round(time.Millisecond).String() + " ago"
}
