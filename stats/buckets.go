package stats

import (
	"fmt"
	"math"

	"github.com/hotproxy/hotproxy/shm"
)

// Bucket layout, mirroring github.com/VictoriaMetrics/metrics Histogram.
const (
	e10Min            = -9
	e10Max            = 18
	bucketsPerDecimal = shm.HistogramPerDecade
	rangeBuckets      = shm.HistogramRangeBuckets
	// NumBuckets is the number of histogram buckets: index 0 counts values
	// below 1e-9, index NumBuckets-1 values at or above 1e18, index i in
	// between the vmrange bucket i-1.
	NumBuckets = shm.HistogramBuckets
)

var (
	// bucketUpper[i] is the inclusive upper bound of range bucket i.
	bucketUpper [rangeBuckets]float64
	// bucketStart maps (binary exponent, top 4 mantissa bits) of a value in
	// [1e-9, 1e18) to the first range bucket that may hold it; a value is
	// at most one bucket further.
	bucketStart [(60 + 31 + 1) * 16]uint16
	// vmranges[i] is the vmrange label of bucket index i.
	vmranges [NumBuckets]string
)

const expBias = 31 // 2^-31 < 1e-9

func init() {
	for i := range bucketUpper {
		n := i + 1
		if n%bucketsPerDecimal == 0 {
			bucketUpper[i] = math.Pow10(e10Min + n/bucketsPerDecimal)
		} else {
			bucketUpper[i] = math.Pow(10, e10Min+float64(n)/bucketsPerDecimal)
		}
	}
	for key := range bucketStart {
		e := key>>4 - expBias
		x0 := math.Ldexp(1+float64(key&15)/16, e)
		i := 0
		for i < rangeBuckets-1 && x0 > bucketUpper[i] {
			i++
		}
		bucketStart[key] = uint16(i)
	}
	// Labels exactly as metrics.Histogram prints them.
	mult := math.Pow(10, 1.0/bucketsPerDecimal)
	v := math.Pow10(e10Min)
	start := fmt.Sprintf("%.3e", v)
	for i := 0; i < rangeBuckets; i++ {
		v *= mult
		end := fmt.Sprintf("%.3e", v)
		vmranges[i+1] = start + "..." + end
		start = end
	}
	vmranges[0] = fmt.Sprintf("0...%.3e", math.Pow10(e10Min))
	vmranges[NumBuckets-1] = fmt.Sprintf("%.3e...+Inf", math.Pow10(e10Max))
}

// BucketIndex returns the bucket index of v, or -1 for NaN and negative
// values (which are ignored, as metrics.Histogram does).
func BucketIndex(v float64) int {
	if !(v >= 1e-9) {
		if v >= 0 {
			return 0
		}
		return -1
	}
	if v >= 1e18 {
		return NumBuckets - 1
	}
	bits := math.Float64bits(v)
	i := int(bucketStart[(int(bits>>52)-1023+expBias)<<4|int(bits>>48&15)])
	for v > bucketUpper[i] {
		i++
	}
	return i + 1
}

// VMRange returns the vmrange label ("<start>...<end>") of bucket index i.
func VMRange(i int) string { return vmranges[i] }

// BucketBounds returns the lower (exclusive) and upper (inclusive) bound
// of bucket index i.
func BucketBounds(i int) (lo, hi float64) {
	switch {
	case i <= 0:
		return 0, 1e-9
	case i >= NumBuckets-1:
		return 1e18, math.Inf(1)
	case i == 1:
		return 1e-9, bucketUpper[0]
	}
	return bucketUpper[i-2], bucketUpper[i-1]
}

// Quantile estimates the q-quantile (0..1) of a histogram's buckets by
// linear interpolation inside the bucket holding the rank. It returns 0 for
// an empty histogram.
func Quantile(buckets []uint64, q float64) float64 {
	var total uint64
	for _, c := range buckets {
		total += c
	}
	if total == 0 {
		return 0
	}
	q = math.Max(0, math.Min(1, q))
	rank := q * float64(total)
	var seen uint64
	for i, c := range buckets {
		if c == 0 {
			continue
		}
		if float64(seen+c) >= rank {
			lo, hi := BucketBounds(i)
			if math.IsInf(hi, 1) {
				return lo
			}
			return lo + (hi-lo)*(rank-float64(seen))/float64(c)
		}
		seen += c
	}
	lo, _ := BucketBounds(len(buckets) - 1)
	return lo
}
